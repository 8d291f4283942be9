"""COCO-Counterfactuals (builders/counterfactuals/METHOD.md; Le et al., NeurIPS 2023 D&B): counterfactual caption pairs and
minimally different image pairs, as script-free Hub parquet.

    counterfactory build coco-counterfactuals --coco-root COCO --output out/ [--models tiny]
    accelerate launch builders/counterfactuals/builder.py --coco-root COCO --output out/

Stages (`--stage`):
- `captions`: one work item per source caption -> `captions/<split>` caption pairs
  (`builders.counterfactuals.captions`); cheap, runs anywhere.
- `images`: caption pairs of an earlier captions build or of any caption-pair table (`--captions-from`:
  a .tsv or .jsonl file, a `datasets` folder or Hub id; `builders.counterfactuals.pair_tables`) ->
  image pairs in `default/<split>` (`builders.counterfactuals.images`); the expensive stage,
  shardable on GPUs.
- `all` (default): both, writing both configs.
- `images` with `--images-from DIR_OR_ZIP`: the image pairs exist already (the published release's
  images.zip): imported for the caption pairs' ids, not generated, and scored with the CLIP filter
  (`builders.counterfactuals.imports`, `builders.counterfactuals.image_sources`).

The `default` config keeps the columns of the original release (`id`, `image_0`, `image_1`,
`caption_0`, `caption_1`; `id` is `<coco image id>_<caption index>`) plus provenance columns.
Sources: COCO (Karpathy splits, or COCO folders such as `val2017` as in the paper) or any
`datasets` dataset with a text column (`--dataset NAME --text-column caption`).
Every row depends only on its caption and the run seed (per-candidate seeds come from the row id),
so shards are identical for any process count; every dropped caption is counted by reason.
"""

from __future__ import annotations

import itertools
import json
import argparse
import sys
from dataclasses import asdict
from typing import Any, Iterable, Iterator, Sequence

from builders.counterfactuals import options
from builders.counterfactuals.captions import CaptionModels, CaptionStage, CounterfactualCaption
from builders.counterfactuals.card import CARD_FIELDS
from builders.counterfactuals.config import CAPTION_ROLES, IMAGE_FILTERS, IMAGE_ROLES, CocoCounterfactualsConfig
from builders.counterfactuals.generators import generator
from builders.counterfactuals.image_sources import (
    FolderSource,
    Layout,
    ZipSource,
    detect_layout,
    open_source,
    pattern_layout,
)
from builders.counterfactuals.images import NO_PASSING_CANDIDATE, ImageSelection, ImageStage
from builders.counterfactuals.imports import ImportStage, import_items
from builders.counterfactuals.schema import CAPTION_FEATURES, PAIR_FEATURES
from builders.counterfactuals.pair_tables import PairTable, read_pairs, resolve_table
from builders.counterfactuals.source import CaptionItem, coco_captions, dataset_captions
from builders.counterfactuals.view import PAIR_VIEW
from builders.engine import progress
from builders.engine.errors import UserFacingError
from builders.engine.precision import Precision, worker_precision
from builders.engine.provenance import model_names
from builders.engine.sharding.base import BuildInfo, Count, Emit, OutputSpec, Skip


class CocoCounterfactualsBuilder:
    """The config's `device` and `torch_threads` say how to run, not what to build: of them only
    the device type enters the fingerprint, with the image stage's `dtype` (`--dtype`, resolved on
    the device by `precision`): both change the images. CPU float reductions depend on the intra-op
    thread count, so bit-identical shards across process counts need the same `torch_threads` in
    every run (`accelerate launch` starts its workers with one thread each)."""

    def __init__(self, config: CocoCounterfactualsConfig) -> None:
        self.config = config
        self._precision: Precision | None = None
        self._caption_stage: CaptionStage | None = None
        self._image_stage: ImageStage | None = None
        self._model_names: dict[str, str] | None = None
        self._table: PairTable | None = None
        self._import_stage: ImportStage | None = None
        self._images: tuple[FolderSource | ZipSource, Layout] | None = None
        self._images_digest: dict[str, Any] | None = None
        self._reference: dict[str, Any] | None = None

    # -- ShardedBuilder ----------------------------------------------------------------------

    def outputs(self) -> list[OutputSpec]:
        split = self.config.split
        specs = []
        if self.config.stage in ("images", "all"):
            specs.append(OutputSpec("default", split, PAIR_FEATURES, PAIR_VIEW.to_dict()))
        if self.config.stage in ("captions", "all"):
            specs.append(OutputSpec("captions", split, CAPTION_FEATURES))
        return specs

    def work_items(self) -> Iterable[Any]:
        cfg = self.config
        if cfg.stage == "images":
            # A stream: a table is read one line or batch at a time, and no further than needed.
            pairs = itertools.islice(read_pairs(cfg, self.pair_table()), cfg.max_captions)
            return import_items(pairs, *self.image_source()) if cfg.image_import else pairs
        items = coco_captions(cfg) if cfg.coco_root else dataset_captions(cfg)
        return items[: cfg.max_captions]

    def source_option(self) -> str:
        cfg = self.config
        if cfg.stage == "images":
            return f"--captions-from {cfg.captions_from}"
        return f"--coco-root {cfg.coco_root}" if cfg.coco_root else f"--dataset {cfg.dataset}"

    def process(self, items: Sequence[Any]) -> Iterator[Emit | Skip | Count]:
        if self.config.torch_threads:
            import torch

            torch.set_num_threads(self.config.torch_threads)
        if self.config.stage == "images":
            # Rows a reader marked bad never get here (the runner counts their input_problem).
            if self.config.image_import:
                yield from self.import_stage().run(items)
            else:
                yield from self._image_rows([item.row for item in items])
            return
        # Blank or non-text captions never reach here: the runner counts the readers'
        # `input_problem` (bad_caption / blank_caption) as input errors.
        pairs = []
        progress.stage("captions")
        for item, outcome in zip(items, self.caption_stage().run([it.text for it in items]), strict=True):
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
        # How it runs, not what it builds: `precision` below records the device type and dtype.
        for how in ("device", "dtype", "torch_threads", "cpu_offload"):
            del config[how]
        config["tagger"] = tagger_info() if self.config.stage != "images" else None
        config["models"] = self._run_models()
        # What the caption pairs were read from, with digests: a changed table is another build.
        table = self.pair_table().provenance if self.config.stage == "images" else None
        config["captions_table"] = table
        if self.config.image_import:
            config["images_source"] = self.images_provenance()
        config["precision"] = self.precision().as_config()
        if self.config.stage != "captions" and not self.config.image_import:
            spec = generator(self.config.images.generator)
            config["generator"] = {
                "name": spec.name,
                "method": spec.method_name(self.config.images.inject),
                "license": spec.license,
                "default_model": spec.default_model,
                # The settings the steps and guidance defaulted to (an explicit flag wins: the
                # used ones are `images.steps` / `images.guidance_range`).
                "reference": self.reference(),
            }
            if "vital_layers" in spec.options:
                from builders.counterfactuals.mmdit_edit import vital_layers_record

                img = self.config.images
                config["generator"]["vital_layers"] = vital_layers_record(
                    spec.name, img.vital_layers, img.vital_layers_provenance, self.reference().get("model")
                )
        # The manifest names a local table as `provenance` names local things, however its path
        # was spelled (`../home/me/pairs.tsv`): in the config and where the command line has it.
        spelled = self.config.captions_from
        local = [spelled] if table is not None and "repo" not in table and _names_folders(spelled) else []
        if self.config.image_import and _names_folders(self.config.image_import.images_from):
            local.append(self.config.image_import.images_from)
        return BuildInfo(
            builder="coco-counterfactuals",
            card_template="coco_counterfactuals.md",
            pretty_name="COCO-Counterfactuals",
            config=config,
            models=dict(config["models"]),
            card_fields=CARD_FIELDS,
            local_inputs=tuple(local),
        )

    def _run_models(self) -> dict[str, str]:
        """The models behind this build's rows: the stage's own (as given; the manifest names
        them), and for `--stage images` the caption models as the captions build named them."""
        own = {r: self.config.models[r] for r in self._stage_roles()}
        if self.config.stage != "images":
            return own
        manifest = self.pair_table().local / "build_manifest.json"
        earlier = json.loads(manifest.read_text()).get("models", {}) if manifest.is_file() else {}
        return {**{r: earlier[r] for r in CAPTION_ROLES if r in earlier}, **own}

    def pair_table(self) -> PairTable:
        """The resolved `--captions-from` (a Hub table is downloaded once per process)."""
        if self._table is None:
            self._table = resolve_table(self.config)
        return self._table

    def image_source(self) -> tuple[FolderSource | ZipSource, Layout]:
        """`--images-from` opened (a zip's directory read) and its layout, once per process."""
        if self._images is None:
            imp = self.config.image_import
            assert imp is not None
            source = open_source(imp.images_from, imp.max_image_bytes)
            layout = pattern_layout(imp.pattern) if imp.pattern else detect_layout(source, imp.layout)
            self._images = source, layout
        return self._images

    def images_provenance(self) -> dict[str, Any]:
        """What the card says was imported: the zip's or folder's name (never its path), its
        sha256 digest (read once per process), the layout and the names it gave."""
        if self._images_digest is None:
            source, layout = self.image_source()
            self._images_digest = {**source.digest(), "layout": layout.name, "names": layout.describe()}
        return self._images_digest

    def _stage_roles(self) -> tuple[str, ...]:
        if self.config.image_import:  # nothing is generated: the CLIP filter scores the pairs
            return ("clip_filter",) if self.config.image_import.clip_scores else ()
        return {"captions": CAPTION_ROLES, "images": IMAGE_ROLES}.get(self.config.stage, CAPTION_ROLES + IMAGE_ROLES)

    def model_names(self) -> dict[str, str]:
        """How rows name this stage's models: as the manifest does (`provenance.model_name`),
        so no row holds a local path."""
        if self._model_names is None:
            self._model_names = model_names({r: self.config.models[r] for r in self._stage_roles()})
        return self._model_names

    # -- stages ------------------------------------------------------------------------------

    def caption_stage(self) -> CaptionStage:
        if self._caption_stage is None:
            m = self.config.models
            models = CaptionModels.load(m["mlm"], m["lm"], m["sentence"], self.precision().device)
            self._caption_stage = CaptionStage(models, self.config.captions)
        return self._caption_stage

    def image_stage(self) -> ImageStage:
        if self._image_stage is None:
            from builders.models.clip import load_scorer
            from builders.models.clip_ids import TRANSFORMERS
            from builders.models.loaders import load_generator

            precision = self.precision()
            if self.config.cpu_offload and precision.device == "cpu":
                raise UserFacingError(
                    "--cpu-offload moves each model to the GPU while it runs: "
                    "it needs a CUDA device (this run is on the CPU)"
                )
            pipe = load_generator(
                generator(self.config.images.generator).pipeline,
                self.config.models["sd"],
                device=precision.device,
                dtype=precision.dtype,
                cpu_offload=self.config.cpu_offload,
            )
            scorer = load_scorer(self.config.models["clip_filter"], precision.device, TRANSFORMERS, precision.dtype)
            self._image_stage = ImageStage(pipe, scorer, self.config.images, self.config.seed)
        return self._image_stage

    def import_stage(self) -> ImportStage:
        if self._import_stage is None:
            from builders.models.clip import load_scorer
            from builders.models.clip_ids import TRANSFORMERS

            imp = self.config.image_import
            assert imp is not None
            precision, scorer = self.precision(), None
            if imp.clip_scores:
                scorer = load_scorer(
                    self.config.models["clip_filter"], precision.device, TRANSFORMERS, precision.dtype
                )
            self._import_stage = ImportStage(
                self.image_source()[0],
                scorer,
                self.config.images,
                imp,
                f"default/{self.config.split}",
                self.model_names().get("clip_filter"),
            )
        return self._import_stage

    def precision(self) -> Precision:
        """The process's device and the image stage's dtype, resolved once (the CLIP filter runs
        in the generator's). A captions-only build runs no image model: its dtype is the
        caption models' fp32, whatever `--dtype`."""
        if self._precision is None:
            dtype = self.config.dtype if self.config.stage != "captions" else "fp32"
            # `auto` on CUDA: the model's reference dtype (FLUX.1 and SD3.5 bf16, the others fp16).
            generates = self.config.stage != "captions" and not self.config.image_import
            auto_cuda = self.reference()["dtype"] if generates else generator(self.config.images.generator).dtype
            self._precision = worker_precision(dtype, self.config.device, auto_cuda)
        return self._precision

    def reference(self) -> dict:
        """The generator model's reference entry: the config's (`options.config_from_args`
        decided it from the model's configs), else decided here the same way (a config built
        in code)."""
        if self._reference is None:
            from builders.counterfactuals.model_references import resolve

            img = self.config.images
            self._reference = img.reference or resolve(img.generator, self.config.models["sd"]).record()
        return self._reference

    def _caption_row(self, item: CaptionItem, cf: CounterfactualCaption) -> dict[str, Any]:
        m = self.model_names()
        return {
            "id": item.id,
            "caption_0": cf.original,
            "caption_1": cf.counterfactual,
            "source": item.source,
            "source_id": item.source_id,
            "source_image_id": item.source_image_id,
            "replaced_word": cf.replaced,
            "replacement_word": cf.replacement,
            "replaced_position": cf.start,
            "similarity": cf.similarity,
            "perplexity": cf.perplexity,
            "caption_candidates": cf.candidates,
            "caption_candidates_in_window": cf.in_window,
            "human_substitution": cf.human_substitution,
            "mlm_model": m["mlm"],
            "lm_model": m["lm"],
            "sentence_model": m["sentence"],
        }

    def _image_rows(self, pairs: Sequence[dict[str, Any]]) -> Iterator[Emit | Skip | Count]:
        for row in progress.items(pairs, "image pairs"):
            unseen = self.image_stage().unseen_edit(row["caption_0"], row["caption_1"])
            if unseen is not None:
                stage = self.image_stage()
                limits = generator(self.config.images.generator).describe_limits(stage.pipe, stage.config.reference)
                yield Skip(
                    unseen,
                    detail=f"id {row['id']}: the text encoders read the same first "
                    f"tokens ({limits}) of both captions, so both images would be the same",
                )
                continue
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
        pair, img = selection.pair, self.config.images
        return {
            "id": row["id"],
            "image_0": pair.image_0,
            "image_1": pair.image_1,
            **{k: row[k] for k in CAPTION_FEATURES if k != "id"},
            "seed": pair.seed,
            "p": pair.p,
            "guidance_scale": pair.guidance,
            "clip_score_0": pair.clip_0,
            "clip_score_1": pair.clip_1,
            "clip_directional": pair.directional,
            "clip_image_similarity": pair.image_similarity,
            "image_candidates_tried": selection.tried,
            "image_candidates_passed": selection.passed,
            **{f"image_rejected_{name}": selection.rejected.get(name) for name in IMAGE_FILTERS},
            "sd_model": self.model_names()["sd"],
            "clip_model": self.model_names()["clip_filter"],
            "generator": img.generator,
            "generation_method": generator(img.generator).method_name(img.inject),
            "steps": img.steps,
            "resolution": img.image_size,
        }


def _names_folders(spelled: str) -> bool:
    """A path spelled with folders (`../home/me/pairs.tsv`, `~/pairs.tsv`): the command line
    quoting it must not be published. A bare name (`pairs.tsv`) says nothing of the machine, and
    renaming it wherever prose quotes the word would rewrite unrelated text."""
    return "/" in spelled or spelled.startswith("~")


def from_args(args: argparse.Namespace) -> CocoCounterfactualsBuilder:
    """The builder of `counterfactory build coco-counterfactuals` (`builders.app.registry`) and of
    `accelerate launch` below, from the options (options.py, which never imports this module)."""
    return CocoCounterfactualsBuilder(options.config_from_args(args))


if __name__ == "__main__":
    from builders.launch import launch_main

    sys.exit(launch_main(options, from_args))
