"""COCO-Counterfactuals (builders/counterfactuals/METHOD.md; Le et al., NeurIPS 2023 D&B): counterfactual caption pairs and
minimally different image pairs, as script-free Hub parquet.

    counterfactory build coco-counterfactuals --coco-root COCO --output out/ [--models tiny]
    accelerate launch builders/counterfactuals/builder.py --coco-root COCO --output out/

Stages (`--stage`):
- `captions`: one work item per source caption -> `captions/<split>` caption pairs
  (`builders.counterfactuals.captions`); cheap, runs anywhere.
- `images`: caption pairs of an earlier captions build (`--captions-from DIR`) -> image pairs in
  `default/<split>` (`builders.counterfactuals.images`); the expensive stage, shardable on GPUs.
- `all` (default): both, writing both configs.

The `default` config keeps the columns of the original release (`id`, `image_0`, `image_1`,
`caption_0`, `caption_1`; `id` is `<coco image id>_<caption index>`) plus provenance columns.
Sources: COCO (Karpathy splits, or COCO folders such as `val2017` as in the paper) or any
`datasets` dataset with a text column (`--dataset NAME --text-column caption`).
Every row depends only on its caption and the run seed (per-candidate seeds come from the row id),
so shards are identical for any process count; every dropped caption is counted by reason.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets

from builders.counterfactuals.captions import CaptionModels, CaptionStage, CounterfactualCaption
from builders.counterfactuals.config import (DEFAULT_COCO_SPLITS, IMAGE_FILTERS, CaptionStageConfig,
                                             ImageStageConfig)
from builders.counterfactuals.images import NO_PASSING_CANDIDATE, ImageSelection, ImageStage
from builders.engine import progress
from builders.engine.dataset_source import load_dataset_split, open_split, stored_values
from builders.engine.distributed import worker_device
from builders.engine.errors import InputFileError, InputProblem, UserFacingError
from builders.counterfactuals.options import STAGES
from builders.counterfactuals.view import PAIR_VIEW
from builders.engine.provenance import model_names
from builders.engine.sharding.base import BuildInfo, Count, Emit, OutputSpec, Skip

_STRING, _FLOAT, _INT = datasets.Value("string"), datasets.Value("float64"), datasets.Value("int32")
#: The models of each stage (the rest of `MODEL_ROLES` is unused by that stage).
CAPTION_ROLES, IMAGE_ROLES = ("mlm", "lm", "sentence"), ("sd", "clip_filter")
CAPTION_FEATURES = datasets.Features({
    "id": _STRING, "caption_0": _STRING, "caption_1": _STRING,
    "source": _STRING, "source_id": _STRING, "source_image_id": _STRING,
    "replaced_word": _STRING, "replacement_word": _STRING, "replaced_position": _INT,
    "similarity": _FLOAT, "perplexity": _FLOAT,
    "caption_candidates": _INT, "caption_candidates_in_window": _INT,
    "human_substitution": datasets.Value("bool"),
    "mlm_model": _STRING, "lm_model": _STRING, "sentence_model": _STRING,
})
PAIR_FEATURES = datasets.Features({
    "id": _STRING, "image_0": datasets.Image(), "image_1": datasets.Image(),
    **{k: v for k, v in CAPTION_FEATURES.items() if k != "id"},
    "seed": datasets.Value("int64"), "p": _FLOAT, "guidance_scale": _FLOAT,
    "clip_score_0": _FLOAT, "clip_score_1": _FLOAT, "clip_directional": _FLOAT,
    "clip_image_similarity": _FLOAT,
    "image_candidates_tried": _INT, "image_candidates_passed": _INT,
    **{f"image_rejected_{name}": _INT for name in IMAGE_FILTERS},
    "sd_model": _STRING, "clip_model": _STRING,
})
COLUMN_DOCS = {
    "id": "`<coco image id>_<caption index>` (COCO) or the source row id",
    "image_0": "synthetic image of caption_0", "image_1": "synthetic image of caption_1",
    "caption_0": "original caption", "caption_1": "counterfactual caption (one noun swapped)",
    "source": "source dataset", "source_id": "source caption id (COCO annotation id)",
    "source_image_id": "source image id", "replaced_word": "noun of caption_0 that was swapped",
    "replacement_word": "its replacement",
    "replaced_position": "character offset of the swap, the same in both captions: caption_0 and "
                         "caption_1 are identical except that `replaced_word` starts there in "
                         "caption_0 and `replacement_word` in caption_1",
    "similarity": "all-MiniLM cosine of the captions", "perplexity": "LM perplexity of caption_1",
    "caption_candidates": "candidates after the length/noun filter",
    "caption_candidates_in_window": "candidates inside the similarity window (null when scored "
                                    "perplexity first, which stops at the first one)",
    "human_substitution": "the swap touches the human taxonomy (girl, man, people, ...)",
    "seed": "seed of the chosen candidate", "p": "Prompt-to-Prompt injection fraction",
    "guidance_scale": "classifier-free guidance", "clip_score_0": "CLIP cos(caption_0, image_0)",
    "clip_score_1": "CLIP cos(caption_1, image_1)", "clip_directional": "CLIP directional similarity",
    "clip_image_similarity": "CLIP cos(image_0, image_1)",
    "image_candidates_tried": "candidate pairs generated",
    "image_candidates_passed": "of which passed every image filter",
    **{f"image_rejected_{name}": f"candidates that failed the {name} filter (a candidate can fail "
                                 "several; null when the filter was off)" for name in IMAGE_FILTERS},
}


# The datasheet prose (motivation, collection, filtering, uses) is in the card template; these
# are the fields the shared card machinery reads.
CARD_FIELDS = {
    "license": "cc-by-4.0",
    "task_categories": ["image-to-text", "text-to-image", "zero-shot-image-classification"],
    "tags": ["counterfactuals", "coco", "synthetic", "stable-diffusion", "prompt-to-prompt"],
    "source_datasets": ["MS-COCO"],
    "summary": "Counterfactual image-text pairs: each original COCO caption gets a counterfactual "
               "caption with one noun swapped, and Stable Diffusion with Prompt-to-Prompt draws a "
               "pair of images that differ only where the captions differ.",
    "column_docs": COLUMN_DOCS,
    "limitations": [
        "Images are synthetic (Stable Diffusion) and inherit its failure modes and social biases.",
        "Automatic filtering leaves errors: both captions may fit an image (hyponym swaps such as "
        "girl -> kid), or an image may miss its subject; swaps of people (`human_substitution`) "
        "had a 44% error rate in the paper's human study (27% overall).",
        "Only nouns are swapped; verbs, attributes and counts are never changed.",
    ],
    "citation": "@inproceedings{le2023cococounterfactuals, title={COCO-Counterfactuals: "
                "Automatically Constructed Counterfactual Examples for Image-Text Pairs}, "
                "author={Le, Tiep and Lal, Vasudev and Howard, Phillip}, booktitle={NeurIPS "
                "Datasets and Benchmarks Track}, year={2023}}",
}


@dataclass
class CocoCounterfactualsConfig:
    """What to build. Example: `CocoCounterfactualsConfig(coco_root="coco", stage="captions",
    models={"mlm": ..., "lm": ..., "sentence": ...})`."""

    stage: str = "all"
    #: COCO source: COCO folders (default `val2017`, as the paper), or Karpathy splits instead.
    coco_root: str | None = None
    coco_splits: tuple[str, ...] | None = None
    karpathy_splits: tuple[str, ...] | None = None
    #: Any `datasets` source with a text column (instead of COCO).
    dataset: str | None = None
    dataset_config: str | None = None
    dataset_split: str = "train"
    text_column: str = "caption"
    id_column: str | None = None
    #: `--stage images`: folder of an earlier captions build.
    captions_from: str | None = None
    #: Keep the first N source captions (None: all).
    max_captions: int | None = None
    #: Split name of the published tables (the original release has one `test` split).
    split: str = "test"
    seed: int = 0
    #: Model id or path per role (`MODEL_ROLES`).
    models: dict[str, str] = field(default_factory=dict)
    captions: CaptionStageConfig = field(default_factory=CaptionStageConfig)
    images: ImageStageConfig = field(default_factory=ImageStageConfig)

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise UserFacingError(f"--stage takes {', '.join(STAGES)} (got {self.stage!r})")
        if self.stage == "images" and not self.captions_from:
            raise UserFacingError("--stage images needs --captions-from DIR (a captions build)")
        if self.stage != "images" and len([x for x in (self.coco_root, self.dataset) if x]) != 1:
            raise UserFacingError("give exactly one caption source: --coco-root DIR or --dataset NAME")
        if self.stage != "images" and self.captions_from:
            raise UserFacingError("--captions-from is only for --stage images")
        if self.coco_splits and self.karpathy_splits:
            raise UserFacingError("give --coco-splits or --karpathy-splits, not both")
        if self.coco_root and not self.karpathy_splits and not self.coco_splits:
            self.coco_splits = DEFAULT_COCO_SPLITS


@dataclass
class CaptionItem:
    id: str
    text: str
    source: str
    source_id: str
    source_image_id: str
    #: Set by the reader for a caption that is not usable text; the runner skips and counts it.
    input_problem: InputProblem | None = None


class CocoCounterfactualsBuilder:
    """`device` and `torch_threads` say how to run, not what to build (not in the fingerprint).
    CPU float reductions depend on the intra-op thread count, so bit-identical shards across
    process counts need the same `torch_threads` in every run (`accelerate launch` starts its
    workers with one thread each)."""

    def __init__(self, config: CocoCounterfactualsConfig, device: str | None = None,
                 torch_threads: int | None = None) -> None:
        self.config, self.device, self.torch_threads = config, device, torch_threads
        self._caption_stage: CaptionStage | None = None
        self._image_stage: ImageStage | None = None
        self._model_names: dict[str, str] | None = None

    # -- ShardedBuilder ----------------------------------------------------------------------

    def outputs(self) -> list[OutputSpec]:
        split = self.config.split
        specs = []
        if self.config.stage in ("images", "all"):
            specs.append(OutputSpec("default", split, PAIR_FEATURES, PAIR_VIEW.to_dict()))
        if self.config.stage in ("captions", "all"):
            specs.append(OutputSpec("captions", split, CAPTION_FEATURES))
        return specs

    def work_items(self) -> Sequence[Any]:
        cfg = self.config
        if cfg.stage == "images":
            items: list[Any] = self._caption_pairs()
        elif cfg.coco_root:
            items = self._coco_captions()
        else:
            items = self._dataset_captions()
        return items[: cfg.max_captions]

    def process(self, items: Sequence[Any]) -> Iterator[Emit | Skip | Count]:
        if self.torch_threads:
            import torch

            torch.set_num_threads(self.torch_threads)
        if self.config.stage == "images":
            yield from self._image_rows(items)
            return
        # Blank or non-text captions never reach here: the runner counts the readers'
        # `input_problem` (bad_caption / blank_caption) as input errors.
        pairs = []
        progress.stage("captions")
        for item, outcome in zip(items, self.caption_stage().run([it.text for it in items])):
            if isinstance(outcome, str):
                yield Skip(outcome)
                continue
            row = self._caption_row(item, outcome)
            yield Emit(f"captions/{self.config.split}", row)
            pairs.append(row)
        if self.config.stage == "all":
            yield from self._image_rows(pairs)

    def info(self) -> BuildInfo:
        from builders.engine.nltk_setup import tagger_info

        config = asdict(self.config)
        config["tagger"] = tagger_info() if self.config.stage != "images" else None
        config["models"] = self._run_models()
        return BuildInfo(builder="coco-counterfactuals", card_template="coco_counterfactuals.md",
                         pretty_name="COCO-Counterfactuals", config=config,
                         models=dict(config["models"]), card_fields=CARD_FIELDS)

    def _run_models(self) -> dict[str, str]:
        """The models behind this build's rows: the stage's own (as given; the manifest names
        them), and for `--stage images` the caption models as the captions build named them."""
        own = {r: self.config.models[r] for r in self._stage_roles()}
        if self.config.stage != "images":
            return own
        manifest = Path(self.config.captions_from) / "build_manifest.json"
        earlier = json.loads(manifest.read_text()).get("models", {}) if manifest.is_file() else {}
        return {**{r: earlier[r] for r in CAPTION_ROLES if r in earlier}, **own}

    def _stage_roles(self) -> tuple[str, ...]:
        return {"captions": CAPTION_ROLES, "images": IMAGE_ROLES}.get(self.config.stage,
                                                                     CAPTION_ROLES + IMAGE_ROLES)

    def model_names(self) -> dict[str, str]:
        """How rows name this stage's models: as the manifest does (`provenance.model_name`),
        so no row holds a local path."""
        if self._model_names is None:
            self._model_names = model_names({r: self.config.models[r] for r in self._stage_roles()})
        return self._model_names

    # -- sources -----------------------------------------------------------------------------

    def _coco_captions(self) -> list[CaptionItem]:
        """Every caption of the selected COCO folders, in annotation-file order (the order of
        `captions_<folder>.json`, folder by folder); `k` in the id `<image id>_<k>` counts an
        image's captions in that order, as the original release does (METHOD.md §1)."""
        from loading_scripts.coco import CocoSourceConfig, load_json, read_coco

        cfg = self.config
        root = Path(cfg.coco_root)
        records = read_coco(CocoSourceConfig(root, coco_splits=cfg.coco_splits,
                                             karpathy_splits=cfg.karpathy_splits,
                                             with_instances=False))
        # read_coco validated the files and sorts by ids; the file order is read here.
        folders = list(cfg.coco_splits) if cfg.coco_splits else sorted({r.folder for r in records})
        position = {}
        for rank, folder in enumerate(folders):
            anns = load_json(root / "annotations" / f"captions_{folder}.json", "captions")["annotations"]
            position.update({(folder, int(a["id"])): (rank, row) for row, a in enumerate(anns)})
        captions = sorted(((rec, cap) for rec in records for cap in rec.captions),
                          key=lambda rc: position[rc[0].folder, rc[1].caption_id])
        seen: dict[int, int] = {}
        items = []
        for rec, cap in captions:
            k = seen[rec.image_id] = seen.get(rec.image_id, -1) + 1
            items.append(CaptionItem(id=f"{rec.image_id}_{k}", text=cap.text,
                                     source=f"coco/{rec.folder}", source_id=str(cap.caption_id),
                                     source_image_id=str(rec.image_id), input_problem=cap.input_problem))
        return items

    def _dataset_captions(self) -> list[CaptionItem]:
        from loading_scripts.coco import caption_problem

        cfg = self.config
        ds = load_dataset_split(cfg.dataset, cfg.dataset_config, cfg.dataset_split)
        missing = [c for c in (cfg.text_column, cfg.id_column) if c and c not in ds.column_names]
        if missing:
            raise InputFileError(cfg.dataset, f"has no column(s) {missing} (columns: {ds.column_names})",
                                 "pick them with --text-column / --id-column")
        # As stored: a text column typed Image is a counted bad caption, its paths never opened.
        texts = stored_values(ds, cfg.text_column)
        ids = [str(x) for x in stored_values(ds, cfg.id_column)] if cfg.id_column else [str(i) for i in range(len(ds))]
        # A non-string or blank text is a counted input error, never coerced (`None` is no caption).
        return [CaptionItem(id=i, text=t if isinstance(t, str) else "", source=cfg.dataset,
                            source_id=i, source_image_id="",
                            input_problem=caption_problem(t, f"{cfg.dataset} row {n} ({cfg.text_column})"))
                for n, (i, t) in enumerate(zip(ids, texts))]

    def _caption_pairs(self) -> list[dict[str, Any]]:
        path = Path(self.config.captions_from)
        ds = open_split(str(path), "captions", self.config.split, flag="--captions-from",
                        cannot_load=lambda err: InputFileError(
                            path, f"holds no `captions` config with a {self.config.split!r} split "
                            f"({err})", "build it with --stage captions first"))
        missing = set(CAPTION_FEATURES) - set(ds.column_names)
        if missing:
            raise InputFileError(path, f"caption pairs lack columns {sorted(missing)}",
                                 "use a coco-counterfactuals captions build")
        return ds.to_list()

    # -- stages ------------------------------------------------------------------------------

    def caption_stage(self) -> CaptionStage:
        if self._caption_stage is None:
            m = self.config.models
            models = CaptionModels.load(m["mlm"], m["lm"], m["sentence"], self._device())
            self._caption_stage = CaptionStage(models, self.config.captions)
        return self._caption_stage

    def image_stage(self) -> ImageStage:
        if self._image_stage is None:
            from builders.models.clip import load_scorer
            from builders.models.clip_ids import TRANSFORMERS
            from builders.models.loaders import load_sd

            device = self._device()
            pipe = load_sd(self.config.models["sd"], device=device)
            scorer = load_scorer(self.config.models["clip_filter"], device, TRANSFORMERS)
            self._image_stage = ImageStage(pipe, scorer, self.config.images, self.config.seed)
        return self._image_stage

    def _device(self) -> str:
        return self.device or worker_device()

    def _caption_row(self, item: CaptionItem, cf: CounterfactualCaption) -> dict[str, Any]:
        m = self.model_names()
        return {
            "id": item.id, "caption_0": cf.original, "caption_1": cf.counterfactual,
            "source": item.source, "source_id": item.source_id,
            "source_image_id": item.source_image_id, "replaced_word": cf.replaced,
            "replacement_word": cf.replacement, "replaced_position": cf.start,
            "similarity": cf.similarity, "perplexity": cf.perplexity,
            "caption_candidates": cf.candidates, "caption_candidates_in_window": cf.in_window,
            "human_substitution": cf.human_substitution,
            "mlm_model": m["mlm"], "lm_model": m["lm"], "sentence_model": m["sentence"],
        }

    def _image_rows(self, pairs: Sequence[dict[str, Any]]) -> Iterator[Emit | Skip | Count]:
        for row in progress.items(pairs, "image pairs"):
            selection = self.image_stage().run(row["id"], row["caption_0"], row["caption_1"])
            # Candidate tallies of every caption pair, also those that got no image pair.
            yield Count("image_candidates_tried", selection.tried)
            yield Count("image_candidates_passed", selection.passed)
            for name, n in selection.rejected.items():
                yield Count(f"image_rejected_{name}", n)
            if self.config.images.early_reject_at is not None:
                yield Count("image_rejected_early", selection.early_rejected)
            if selection.pair is None:
                yield Skip(NO_PASSING_CANDIDATE)
            else:
                yield Emit(f"default/{self.config.split}", self._pair_row(row, selection))

    def _pair_row(self, row: dict[str, Any], selection: ImageSelection) -> dict[str, Any]:
        pair = selection.pair
        return {
            "id": row["id"], "image_0": pair.image_0, "image_1": pair.image_1,
            **{k: row[k] for k in CAPTION_FEATURES if k != "id"},
            "seed": pair.seed, "p": pair.p, "guidance_scale": pair.guidance,
            "clip_score_0": pair.clip_0, "clip_score_1": pair.clip_1,
            "clip_directional": pair.directional, "clip_image_similarity": pair.image_similarity,
            "image_candidates_tried": selection.tried, "image_candidates_passed": selection.passed,
            **{f"image_rejected_{name}": selection.rejected.get(name) for name in IMAGE_FILTERS},
            "sd_model": self.model_names()["sd"], "clip_model": self.model_names()["clip_filter"],
        }


if __name__ == "__main__":
    from builders.counterfactuals import options
    from builders.launch import launch_main

    sys.exit(launch_main(options))
