"""`counterfactory eccv candidates | tasks | ingest | model-bias`: a machine-in-the-loop round.

    counterfactory eccv candidates --coco-root COCO --model ID --model ID ... --output run/candidates.json
    counterfactory eccv tasks run/candidates.json --output run/tasks
    (annotate run/tasks/label_studio_tasks.json in Label Studio, or fill in run/tasks/tasks.csv)
    counterfactory eccv ingest export.json ... --tasks run/tasks --state run/state --output out/v2
    counterfactory publish out/v2 --repo-id ORG/NAME --version v2.0.0
    counterfactory eccv model-bias --tasks run/tasks --state run/state --output run/bias

Heavy libraries are imported inside the handlers so `--help` stays instant.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.engine.option_types import number, positive_int, seed_int
from builders.engine.precision import add_dtype_argument
from builders.models.families import DEFAULT_K
from builders.models.pickled_weights import FLAG as PICKLE_FLAG, FLAG_HELP as PICKLE_FLAG_HELP


def _candidates(args: argparse.Namespace) -> int:
    from builders.eccv_positives.mitl.candidates import CandidatesConfig, find_candidates
    from builders.eccv_positives.mitl.image_gallery import DatasetSource
    from builders.models.pickled_weights import trusting_pickled_weights

    dataset = None
    if args.dataset:
        dataset = DatasetSource(
            path=args.dataset,
            config=args.dataset_config,
            split=args.dataset_split,
            image_column=args.image_column,
            text_column=args.text_column,
            image_id_column=args.image_id_column,
            caption_id_column=args.caption_id_column,
        )
    cfg = CandidatesConfig(
        models=tuple(args.model),
        coco_root=str(args.coco_root) if args.coco_root else None,
        splits=tuple(args.splits),
        dataset=dataset,
        image_queries=args.image_queries,
        caption_queries=args.caption_queries,
        seed=args.seed,
        k=args.k,
        exclusion_depth=args.exclusion_depth,
        cache_dir=str(args.cache_dir) if args.cache_dir else None,
        batch_size=args.batch_size,
        dtype=args.dtype,
        first_stage=args.first_stage,
        rerank_k=args.rerank_k,
    )
    with trusting_pickled_weights(args.trust_pickled_weights):
        found = find_candidates(cfg)
    found.save(args.output)
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from builders.eccv_positives.mitl.tasks import TasksConfig, write_tasks

    write_tasks(
        TasksConfig(
            candidates=str(args.candidates),
            output=str(args.output),
            seed=args.seed,
            image_url_template=args.image_url_template,
            embed_thumbnails=args.embed_thumbnails,
        )
    )
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from builders.eccv_positives.mitl.ingest import IngestConfig, ingest
    from builders.engine.errors import UserFacingError

    if args.repo_id and not (args.version and args.output):
        raise UserFacingError("--repo-id publishes the build: also give --output and --version")

    report = ingest(
        IngestConfig(
            verdicts=tuple(str(v) for v in args.verdicts),
            tasks=str(args.tasks),
            state=str(args.state),
            strict=args.strict,
            exclude_failed_golden=not args.keep_failed_golden,
            cxc_dir=str(args.cxc_dir) if args.cxc_dir else None,
            cxc_sits=tuple(str(p) for p in args.cxc_sits or ()),
            cxc_min_score=args.cxc_min_score,
            coco_ids=args.coco_ids or None,
        )
    )
    if args.output is None:
        return 0
    from builders.eccv_positives.builder import EccvPositivesBuilder
    from builders.eccv_positives.config import EccvImportConfig
    from builders.engine.sharding.runner import BuildRunConfig, run_build
    from builders.publishing.card import write_card

    # A dataset gallery has no COCO root: the new version then holds ids only.
    root = args.coco_root or report["candidates_config"]["coco_root"]
    run_build(
        EccvPositivesBuilder(
            EccvImportConfig(
                coco_root=str(root) if root else None,
                annotations_dir=str(Path(args.state) / "annotations"),
                pm_zeta=args.pm_zeta,
            )
        ),
        BuildRunConfig(output_dir=args.output, overwrite=args.overwrite),
        finish=write_card,
    )
    if args.repo_id:
        from builders.publishing.publish import PublishConfig, publish

        publish(PublishConfig(output_dir=args.output, repo_id=args.repo_id, version=args.version))
    return 0


def _model_bias(args: argparse.Namespace) -> int:
    from builders.eccv_positives.mitl.model_bias import ModelBiasConfig, score_models, write_report
    from builders.models.pickled_weights import trusting_pickled_weights

    cfg = ModelBiasConfig(
        tasks=str(args.tasks),
        state=str(args.state),
        output=str(args.output),
        models=tuple(args.model or ()),
        cache_dir=str(args.cache_dir) if args.cache_dir else None,
        dtype=args.dtype,
        first_stage=args.first_stage,
        rerank_k=args.rerank_k,
    )
    with trusting_pickled_weights(args.trust_pickled_weights):
        scores = score_models(cfg)
    out = write_report(cfg, scores)
    print((out / "model_bias.md").read_text(), end="")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    eccv = subparsers.add_parser("eccv", help="machine-in-the-loop tooling for new ECCV Caption-style positives")
    sub = eccv.add_subparsers(dest="eccv_command", metavar="STAGE", required=True)
    for add_stage in (_add_candidates, _add_tasks, _add_ingest, _add_model_bias):
        add_stage(sub)


def _add_candidates(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "candidates",
        help="machine annotators propose top-k candidate pairs",
        description="Embed the gallery with each model (cached), sample queries, "
        "retrieve each model's top-k, union them with per-model ranks.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--coco-root", type=Path, help="COCO download holding the gallery")
    source.add_argument("--dataset", help="or any image-caption dataset (Hub id or folder)")
    p.add_argument("--dataset-config", default=None)
    p.add_argument("--dataset-split", default="test")
    p.add_argument("--image-column", default="image")
    p.add_argument("--text-column", default="caption", help="a caption or a list of captions per row")
    p.add_argument("--image-id-column", default=None, help="default: row numbers")
    p.add_argument("--caption-id-column", default=None, help="default: running numbers")
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="ID",
        help="a machine annotator (repeat): transformers CLIP id/folder, or open_clip "
        "as open_clip:ARCH[:TAG], hf-hub:ORG/REPO, local-dir:PATH; a BLIP ITM (its ITC top --rerank-k "
        "re-ranked by ITM + ITC) or FLAVA (its contrastive embeddings); or a ViLT or BridgeTower ITM "
        "cross-encoder with --first-stage",
    )
    _add_reranking(p, of_round=False)
    p.add_argument("--splits", nargs="+", default=["test"], help="Karpathy splits of a COCO gallery")
    p.add_argument("--image-queries", type=int, default=1261, help="sampled image queries (paper: 1261)")
    p.add_argument("--caption-queries", type=int, default=1333, help="sampled caption queries (paper: 1333)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--k", type=int, default=5, help="candidates per model and query (paper: 5)")
    p.add_argument(
        "--exclusion-depth", type=int, default=25, help="golden negatives avoid every model's top-N (paper: 25)"
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="cache of embeddings and re-ranked scores")
    p.add_argument("--batch-size", type=int, default=64)
    add_dtype_argument(p, "the annotators' embeddings")
    p.add_argument("--output", type=Path, required=True, help="candidates JSON file to write")
    p.add_argument(PICKLE_FLAG, action="store_true", help=PICKLE_FLAG_HELP)
    p.set_defaults(func=_candidates)


def _add_reranking(p: argparse.ArgumentParser, of_round: bool) -> None:
    """--first-stage and --rerank-k, one meaning for `candidates` and `model-bias` (`of_round`:
    defaulting to the round's own when its annotators are ranked)."""
    own = "the round's own when its annotators are ranked, else " if of_round else ""
    first_default = f" (default: {own}none)" if of_round else ""
    p.add_argument(
        "--first-stage",
        default=None,
        metavar="ID",
        help="the model whose top --rerank-k a ViLT or BridgeTower ITM --model re-ranks: a CLIP, or a "
        f"model with contrastive embeddings (BLIP, FLAVA, BridgeTowerForContrastiveLearning){first_default}",
    )
    p.add_argument(
        "--rerank-k",
        type=positive_int,
        default=None if of_round else DEFAULT_K,
        help=f"candidates a BLIP, ViLT or BridgeTower --model re-ranks per query (default: {own}{DEFAULT_K}, "
        "BLIP's COCO k_test)",
    )


def _add_tasks(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tasks",
        help="package candidates into 20-item verification tasks",
        description="18 candidates + 1 golden positive + 1 golden negative per task; "
        "exports Label Studio import JSON (+ label config) and CSV.",
    )
    p.add_argument("candidates", type=Path, help="candidates JSON from `eccv candidates`")
    p.add_argument("--output", type=Path, required=True, help="folder for tasks.json and the exports")
    p.add_argument("--seed", type=seed_int, default=0, help="task shuffle seed")
    p.add_argument(
        "--image-url-template",
        default="/data/local-files/?d={file}",
        help="image reference with {file}, {file_name}, {image_id}",
    )
    p.add_argument(
        "--embed-thumbnails", action="store_true", help="embed JPEG thumbnails (data: URIs) instead of image URLs"
    )
    p.set_defaults(func=_tasks)


def _add_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="quality-check verdicts and build the new positives",
        description="Ingest Label Studio JSON exports or CSV verdicts (a worker's "
        "incomplete task is skipped and counted); exclude tasks failing a golden; "
        "vote; remove invalid captions; merge with CxC and COCO; "
        "optionally build (--output) and publish (--repo-id/--version).",
    )
    p.add_argument("verdicts", type=Path, nargs="+", help="Label Studio JSON exports or CSV files")
    p.add_argument("--tasks", type=Path, required=True, help="tasks folder (or tasks.json)")
    p.add_argument("--state", type=Path, required=True, help="folder accumulating verdicts")
    p.add_argument("--strict", action="store_true", help="positives are '100%% YES' only")
    p.add_argument(
        "--keep-failed-golden",
        action="store_true",
        help="keep submissions that fail a golden item (default: excluded)",
    )
    cxc = p.add_mutually_exclusive_group()
    cxc.add_argument(
        "--cxc-dir",
        type=Path,
        default=None,
        help="CxC positives in the eccv_caption format (default: the shipped ones, "
        "for a COCO gallery or with --coco-ids)",
    )
    cxc.add_argument(
        "--cxc-sits",
        type=Path,
        nargs="+",
        default=None,
        metavar="CSV",
        help="CxC rating files (sits_test.csv ...), pairs scoring >= --cxc-min-score",
    )
    p.add_argument("--cxc-min-score", type=number, default=3.0, help="CxC threshold (paper: 3)")
    p.add_argument(
        "--coco-ids",
        action="store_true",
        help="a --dataset gallery's ids are COCO ids: merge the shipped CxC and remove the "
        "paper's Appendix C.1 ids (always done for a --coco-root gallery)",
    )
    p.add_argument("--output", type=Path, default=None, help="build the new version here")
    p.add_argument("--overwrite", action="store_true", help="replace a previous build in --output")
    p.add_argument("--coco-root", type=Path, default=None, help="default: the candidates' COCO root")
    p.add_argument("--pm-zeta", type=int, default=0)
    p.add_argument("--repo-id", default=None, help="publish the build to this Hub dataset")
    p.add_argument("--version", default=None, help="tag of the published version (v1.2.3)")
    p.set_defaults(func=_ingest)


def _add_model_bias(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model-bias", help="rank models on single-annotator positive sets (Appendix E)")
    p.add_argument("--tasks", type=Path, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="ID",
        help="a model to rank (repeat; default: the round's annotators), as `candidates` ranks it: a "
        "re-ranker (BLIP, ViLT, BridgeTower ITM) from its top --rerank-k, which must hold each query's positives",
    )
    _add_reranking(p, of_round=True)
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="embedding cache (default: the one the round's candidates used)"
    )
    add_dtype_argument(p, "the embeddings (the round's, to reuse its cache)")
    p.add_argument("--output", type=Path, required=True, help="folder for the table and the plot")
    p.add_argument(PICKLE_FLAG, action="store_true", help=PICKLE_FLAG_HELP)
    p.set_defaults(func=_model_bias)
