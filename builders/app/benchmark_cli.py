"""`counterfactory benchmark`: score CLIP models on our datasets (ODmAP@k, ITM score deltas,
COCO R@K, ECCV Caption / CxC / PMRP on COCO 5K, object necessity) and write results.jsonl + report.md (training/report/). Registering imports nothing
heavy; the handler imports the evaluation."""

from __future__ import annotations

import argparse
from pathlib import Path

from builders.engine.option_types import non_negative_int, positive_int, seed_int
from builders.models.pickled_weights import FLAG as PICKLE_FLAG, FLAG_HELP as PICKLE_FLAG_HELP

SOURCE_HELP = "build folder or Hub dataset id[@revision]"


def _benchmark(args: argparse.Namespace) -> int:
    from training.report.run import BenchmarkConfig, run_benchmark

    models = list(args.model or [])
    blind_lm = args.blind_lm
    if args.models == "tiny":
        from builders.models.profiles import tiny_profile

        profile = tiny_profile(Path(args.tiny_models_dir) if args.tiny_models_dir else None)
        models += [profile.clip, profile.open_clip]
        blind_lm = blind_lm or profile.lm
    cfg = BenchmarkConfig(
        models=models,
        output=args.output,
        eval_batch_size=args.eval_batch_size,
        num_workers=args.num_workers,
        cache_dir=args.cache_dir,
        push_to_hub=args.push_to_hub,
        revision_tag=args.revision_tag,
        coco_instances=args.coco_instances,
        trust_pickled_weights=args.trust_pickled_weights,
        bootstrap=args.bootstrap,
        seed=args.seed,
        baseline=args.baseline,
        blind_lm=blind_lm,
        blind_sentence_model=args.blind_sentence_model,
        plots=args.plots,
        clip_g=args.clip_g,
        first_stage=args.first_stage,
        rerank_k=args.rerank_k,
        sources={"coco": args.coco, "decorrelation": args.decorrelation, "counterfactuals": args.counterfactuals},
    )
    records = run_benchmark(cfg)
    out = Path(args.output)
    print(f"{len(records)} records: {out / 'results.jsonl'}, report: {out / 'report.md'}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "benchmark",
        help="score CLIP models on our datasets (ODmAP@k, ITM deltas, COCO R@K): results.jsonl + report.md",
        description="Score each --model on each dataset given with the trainer's --eval-only "
        "evaluation and the project's metric modules; writes OUTPUT/results.jsonl (one record per "
        "model x dataset x metric) and OUTPUT/report.md (a table per model, a comparison per dataset).",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="MODEL",
        help="repeatable: a Hugging Face CLIP id or save_pretrained folder (a training "
        "run's final/), an open_clip folder, open_clip:ARCH:TAG, hf-hub:ID or local-dir:PATH; "
        "or a BLIP, BridgeTower, ViLT or FLAVA retrieval model (id or folder: ITM deltas)",
    )
    p.add_argument(
        "--models",
        choices=("tiny",),
        default=None,
        help="tiny: add the project's two tiny random-init CLIPs (transformers, open_clip)",
    )
    p.add_argument("--tiny-models-dir", default=None, help="where the tiny models are built/cached")
    _add_dataset_arguments(p)
    p.add_argument("--output", required=True, help="report folder (results.jsonl, report.md)")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="embedding cache, shared by reports: a model already scored on the same data "
        "is not encoded again (default: OUTPUT/embeddings)",
    )
    p.add_argument(
        "--push-to-hub",
        default=None,
        metavar="ORG/NAME",
        help="append the records to this results dataset on the Hub (HF_ENDPOINT, HF_TOKEN); "
        "records already there are skipped",
    )
    p.add_argument("--revision-tag", default=None, help="with --push-to-hub: tag the pushed state")
    p.add_argument("--eval-batch-size", type=positive_int, default=64, help="encoding batch size")
    p.add_argument("--num-workers", type=non_negative_int, default=0, help="DataLoader workers decoding images")
    _add_statistics_arguments(p)
    p.add_argument(
        "--no-plots",
        dest="plots",
        action="store_false",
        help="numbers only: draw no figure (forest plots, ITM delta histograms, ODmAP per class) "
        "and never import matplotlib; report.md says the figures were not drawn",
    )
    p.add_argument(
        "--clip-g",
        choices=("cosine", "logits_per_text"),
        default="cosine",
        help="a CLIP's ITM score G: the cosine (default: comparable between models whatever "
        "logit scale each learnt) or its logits_per_text, the logit scale times the cosine, as "
        "the COCO-Counterfactuals script scores it; a cross-encoder's G is its own ITM head's",
    )
    _add_retrieval_arguments(p)
    p.add_argument(PICKLE_FLAG, action="store_true", help=PICKLE_FLAG_HELP)
    p.set_defaults(func=_benchmark)


def _add_retrieval_arguments(p: argparse.ArgumentParser) -> None:
    """How a cross-encoder ranks (training/rerank.py)."""
    p.add_argument(
        "--first-stage",
        default=None,
        metavar="MODEL",
        help="a CLIP (id or folder), or a model with contrastive embeddings (BLIP, FLAVA, "
        "BridgeTowerForContrastiveLearning), whose top k a cross-encoder without a dual encoder of "
        "its own (ViLT, BridgeTower's ITM head) re-ranks by its ITM score on --coco and "
        "--decorrelation; without it those get no retrieval metrics (their ITM deltas still run). "
        "BLIP re-ranks its own ITC top k, FLAVA and BridgeTowerForContrastiveLearning rank by their "
        "contrastive embeddings",
    )
    p.add_argument(
        "--rerank-k",
        type=positive_int,
        default=256,
        metavar="K",
        help="candidates a query a cross-encoder re-ranks, capped at the gallery size (default 256, "
        "BLIP's COCO k_test); recorded with every retrieval number",
    )


def _add_dataset_arguments(p: argparse.ArgumentParser) -> None:
    """The builds scored, one flag per dataset."""
    p.add_argument(
        "--coco",
        default=None,
        help=f"coco-captions build ({SOURCE_HELP}): R@1/5/10 on its test split; on the COCO 5K "
        "test split also ECCV mAP@R / R-P / R@1 and CxC, and with --decorrelation "
        "object necessity PN per removed class",
    )
    p.add_argument(
        "--coco-instances",
        default=None,
        metavar="PATH",
        help="COCO's annotations/instances_val2014.json: adds PMRP on the COCO 5K test split",
    )
    p.add_argument("--decorrelation", default=None, help=f"decorrelation build ({SOURCE_HELP}): ODmAP@1/5/10")
    p.add_argument(
        "--counterfactuals",
        default=None,
        help=f"coco-counterfactuals build ({SOURCE_HELP}): ITM deltas IR_c/TR_c of its test split; "
        "a renderings dataset (a config per generator): each generator's, and the generator-bias "
        "table (paired differences on the pairs every generator kept)",
    )


def _add_statistics_arguments(p: argparse.ArgumentParser) -> None:
    """The intervals, the paired comparisons and the blind baseline."""
    p.add_argument(
        "--bootstrap",
        type=non_negative_int,
        default=1000,
        metavar="N",
        help="resamples of each metric's units (images, queries, pairs) for its 95%% "
        "interval and the paired tests between models (default 1000; 0: none)",
    )
    p.add_argument(
        "--seed",
        type=seed_int,  # numpy's default_rng takes no negative seed: refused before any scoring
        default=0,
        help="seed of the resamples and of the paired tests (default 0): the same seed gives the same intervals",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="MODEL",
        help="compare every model with this one (a --model, or one more model scored "
        "first): differences, paired intervals and Holm-corrected p-values",
    )
    p.add_argument(
        "--blind-lm",
        default=None,
        metavar="MODEL",
        help="with --counterfactuals: the causal LM of the blind text-only baseline, which "
        "scores each caption alone (default: the builder's openai-community/gpt2-large; "
        "the tiny LM with --models tiny; none: no blind baseline)",
    )
    p.add_argument(
        "--blind-sentence-model",
        default=None,
        metavar="MODEL",
        help="the sentence model of the blind baseline (default: the shipped all-MiniLM-L6-v2)",
    )
