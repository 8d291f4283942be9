"""Object-decorrelation sets (builders/decorrelation/METHOD.md; Kim et al., CVPR-W 2023): object-removal pairs and ODmAP@k.

From a COCO (or Flickr30k + Entities) source, per image with at least two classes, each class c^r
is tried for removal under the rules of `builders.decorrelation.selection`; the removed region is filled
(`builders.decorrelation.fill`) and, for training pairs, a caption y' is synthesised
(`builders.decorrelation.captions`). Products (see `builders.decorrelation.schema`):

- `default/train`: D' from the Karpathy train (+restval) split;
- `odmap_queries/test` + `odmap_gallery/test`: the ODmAP@k evaluation set — removal queries from
  the test split and the caption gallery of train+restval+val+test with class-mention vectors,
  which `evaluate_modules/odmap` consumes directly.

    counterfactory build decorrelation --coco-root COCO --output out/ [--models tiny]
    accelerate launch builders/decorrelation/builder.py --coco-root COCO --output out/

Every row depends only on its own image and the run seed (`derive_seed(seed, image_id, anchor)`),
so shards are identical for any process count, part size and resume history. Each candidate the
rules reject, and each row whose caption cannot be made, is counted by reason in the part stats
and the card.
"""

from __future__ import annotations

import random
import argparse
import sys
from dataclasses import asdict
from typing import Any, Iterator, Sequence

import numpy as np
from PIL import Image

from builders.decorrelation import options
from builders.decorrelation.captions import CaptionSynthesizer
from builders.decorrelation.config import DecorrelationConfig
from builders.decorrelation.fill import ImageFiller, dilate
from builders.decorrelation.schema import COLUMN_DOCS, gallery_features, query_features, train_features
from builders.decorrelation.selection import Removal, select_removals
from builders.decorrelation.source import SourceImage, read_source
from builders.decorrelation.verify import REASON_STILL_VISIBLE, RemovalVerifier, Verdict
from builders.decorrelation.view import EDIT_VIEW
from builders.engine import progress
from builders.engine.errors import UserFacingError
from builders.engine.precision import Precision, worker_precision
from builders.engine.provenance import model_names
from builders.engine.seeding import derive_seed
from builders.engine.sharding.base import BuildInfo, Emit, OutputSpec, Skip
from loading_scripts.images import IMAGE_ENCODING

TRAIN_OUT, QUERY_OUT, GALLERY_OUT = "default/train", "odmap_queries/test", "odmap_gallery/test"


class DecorrelationBuilder:
    """The config's `dtype` (`--dtype`) is the precision of the inpainting pipeline and the
    removal check, resolved with the process's device once (`precision`); resolved, it enters the
    recorded config (it changes x')."""

    def __init__(self, config: DecorrelationConfig) -> None:
        self.config = config
        self._precision: Precision | None = None
        self._filler: ImageFiller | None = None
        self._verifier: RemovalVerifier | None = None
        self._captioner: CaptionSynthesizer | None = None
        self._phrases: Any = None
        self._model_names: dict[str, str | None] | None = None

    # ------------------------------------------------------------------ ShardedBuilder protocol

    def outputs(self) -> list[OutputSpec]:
        cfg, out = self.config, []
        if "train" in cfg.products:
            out.append(OutputSpec("default", "train", train_features(cfg.keep_original), EDIT_VIEW.to_dict()))
        if "odmap" in cfg.products:
            out.append(OutputSpec("odmap_queries", "test", query_features(cfg.keep_original), EDIT_VIEW.to_dict()))
            out.append(OutputSpec("odmap_gallery", "test", gallery_features(len(cfg.source.class_names))))
        return out

    def _needs_text(self) -> bool:
        cfg = self.config
        return "odmap" in cfg.products or ("train" in cfg.products and cfg.caption.method == "np_removal")

    def work_items(self) -> list[SourceImage]:
        cfg = self.config
        if self._needs_text() and cfg.source.kind == "coco":
            from builders.engine.nltk_setup import ensure_nltk_tagger

            ensure_nltk_tagger()  # fail before any part is built, with the download command
        splits = set()
        if "train" in cfg.products:
            splits |= set(cfg.train_splits)
        if "odmap" in cfg.products:
            splits |= {cfg.query_split, *cfg.gallery_splits}
        records = read_source(cfg.source, tuple(sorted(splits)))
        unknown = sorted({b.category for r in records for b in r.objects} - set(cfg.source.class_names))
        if unknown:  # checked up front: matching would otherwise fail mid-run on these classes
            raise UserFacingError(
                f"{cfg.source.root}: box categories {unknown} are not among the "
                f"{len(cfg.source.class_names)} classes of the matching table"
            )
        return records

    def source_option(self) -> str:
        source = self.config.source
        return f"--{'coco-root' if source.kind == 'coco' else 'flickr30k-root'} {source.root}"

    def process(self, items: Sequence[SourceImage]) -> Iterator[Emit | Skip]:
        cfg = self.config
        if "odmap" in cfg.products:
            progress.stage("gallery captions")
            yield from self._gallery_rows([r for r in items if r.split in cfg.gallery_splits])
        for rec in progress.items(items, f"removing objects ({cfg.fill.method})"):
            train = "train" in cfg.products and rec.split in cfg.train_splits
            query = "odmap" in cfg.products and rec.split == cfg.query_split
            if train or query:
                yield from self._removal_rows(rec, train)

    def info(self) -> BuildInfo:
        from builders.decorrelation.card import card_fields

        cfg = self.config
        models = {}
        if cfg.fill.model_id:
            models["sd_inpaint"] = cfg.fill.model_id
        if cfg.verify.enabled:
            models["clip_filter"] = cfg.verify.model
        if "train" in cfg.products and cfg.caption.model_id:
            models["captioner"] = cfg.caption.model_id
        config = asdict(cfg)
        del config["dtype"]  # as requested; `precision` below records it resolved
        config["source"]["root"] = str(cfg.source.root)
        config["class_names"] = list(cfg.source.class_names)
        # Without models the rows do not depend on the device: nothing to record or check.
        config["precision"] = self.precision().as_config() if models else None
        if cfg.keep_original:  # only `original_image` holds real images (x' and masks are PNG)
            config["image_encoding"] = IMAGE_ENCODING
        return BuildInfo(
            builder="decorrelation",
            card_template="decorrelation.md",
            pretty_name=f"Object-decorrelation sets ({cfg.source.kind})",
            config=config,
            models=models,
            card_fields=card_fields(cfg, COLUMN_DOCS, config["precision"]),
        )

    # ------------------------------------------------------------------ rows

    def precision(self) -> Precision:
        """The process's device and the fill / removal-check dtype, resolved once. The captioner
        runs in fp32; a build whose only model is the captioner is fp32 whatever `--dtype`."""
        if self._precision is None:
            cfg = self.config
            uses_dtype = cfg.fill.method == "inpaint" or cfg.verify.enabled
            self._precision = worker_precision(cfg.dtype if uses_dtype else "fp32")
        return self._precision

    def model_names(self) -> dict[str, str | None]:
        """The fill and caption models as rows record them: named as the manifest names them
        (`provenance.model_name`), so no row holds a local path; None for the baselines."""
        if self._model_names is None:
            cfg = self.config
            self._model_names = model_names({"fill": cfg.fill.model_id, "caption": cfg.caption.model_id})
        return self._model_names

    def _phrase_matcher(self):
        if self._phrases is None:
            from builders.decorrelation.captions import CocoPhrases, EntityPhrases

            self._phrases = CocoPhrases() if self.config.source.kind == "coco" else EntityPhrases()
        return self._phrases

    def _gallery_rows(self, records: Sequence[SourceImage]) -> Iterator[Emit]:
        captions = [(rec, cap) for rec in records for cap in rec.captions]
        if not captions:
            return
        names = self.config.source.class_names
        mentions = self._phrase_matcher().mentions([c for _, c in captions], names)
        for (rec, cap), row in zip(captions, mentions, strict=True):
            yield Emit(
                GALLERY_OUT,
                {
                    "caption_id": cap.caption_id,
                    "image_id": rec.image_id,
                    "source_split": rec.split,
                    "caption": cap.text,
                    "mentions": row.tolist(),
                    "mentioned_classes": [c for c, hit in zip(names, row, strict=True) if hit],
                },
            )

    def _removal_rows(self, rec: SourceImage, train: bool) -> Iterator[Emit | Skip]:
        cfg = self.config
        if rec.width < 1 or rec.height < 1:
            yield Skip(
                "invalid_image_size",
                kind="error",
                detail=f"image {rec.image_id}: annotated size {rec.width}x{rec.height}",
            )
            return
        selection = select_removals(rec.objects, rec.width, rec.height, cfg.selection)
        for rejection in selection.rejections:
            yield Skip(rejection.reason, detail=f"image {rec.image_id} {rejection.anchor}: {rejection.detail}")
        if not selection.removals:
            return
        checked = yield from self._open(rec)
        if checked is None:
            return
        image = checked.pixels
        # The source as stored (its bytes as read, or PNG): made once, whatever the removals.
        original = checked.cell(cfg.source.strip_metadata) if cfg.keep_original else None
        for removal in selection.removals:
            seed = derive_seed(cfg.seed, rec.image_id, removal.anchor)
            fill_mask = dilate(removal.mask, cfg.fill.mask_dilation)
            synthetic = self._fill().fill(image, fill_mask, seed)
            verdict = None
            if cfg.verify.enabled:
                verdict = self._verify().check(image, synthetic, fill_mask, removal.removed)
                if verdict.still_visible:
                    scores = {c: round(p, 3) for c, p in zip(removal.removed, verdict.after, strict=True)}
                    yield Skip(
                        REASON_STILL_VISIBLE,
                        detail=f"image {rec.image_id} {removal.anchor}: after the fill CLIP scores "
                        f"{scores} (threshold {cfg.verify.threshold})",
                    )
                    continue
            edit = self._edit_columns(rec, removal, fill_mask, synthetic, seed, original, verdict)
            if train:
                yield from self._train_rows(rec, removal, edit, synthetic, seed)
            else:
                yield Emit(
                    QUERY_OUT,
                    {
                        "query_id": f"{rec.image_id}/{removal.anchor}",
                        **edit,
                        "caption_ids": [c.caption_id for c in rec.captions],
                    },
                )

    def _open(self, rec: SourceImage):
        """The checked source image, or None after yielding an input-error skip (a generator
        helper): too large, not of its annotated size (the boxes would be wrong), or unreadable."""
        from loading_scripts.images import ImageProblem, check_image

        try:
            return check_image(
                rec.path, max_pixels=self.config.source.max_image_pixels, expected_size=(rec.width, rec.height)
            )
        except ImageProblem as err:
            yield Skip(err.reason, kind="error", detail=str(err))
            return None

    def _fill(self) -> ImageFiller:
        if self._filler is None:
            self._filler = ImageFiller(self.config.fill, self.precision())
        return self._filler

    def _verify(self) -> RemovalVerifier:
        if self._verifier is None:
            self._verifier = RemovalVerifier(self.config.verify, self.config.source.class_names, self.precision())
        return self._verifier

    def _edit_columns(
        self,
        rec: SourceImage,
        removal: Removal,
        fill_mask: np.ndarray,
        synthetic: Image.Image,
        seed: int,
        original: dict[str, Any] | None,
        verdict: Verdict | None,
    ) -> dict[str, Any]:
        cfg = self.config
        cols = {
            "image_id": rec.image_id,
            "source_split": rec.split,
            "image": synthetic,
            "removed_classes": list(removal.removed),
            "present_classes": list(removal.present),
            "anchor_class": removal.anchor,
            "removal": removal.kind,
            "removed_boxes": [
                {"category": rec.objects[i].category, "bbox": list(rec.objects[i].bbox)} for i in removal.box_indices
            ],
            "mask": Image.fromarray(fill_mask.astype(np.uint8) * 255, mode="L"),
            "region_fraction": removal.region_fraction,
            "fill": cfg.fill.method,
            "fill_model": self.model_names()["fill"],
            "seed": seed,
            "visibility_before": list(verdict.before) if verdict else None,
            "visibility_after": list(verdict.after) if verdict else None,
        }
        if cfg.keep_original:
            cols["original_image"] = original
        return cols

    def _train_rows(
        self, rec: SourceImage, removal: Removal, edit: dict[str, Any], synthetic: Image.Image, seed: int
    ) -> Iterator[Emit | Skip]:
        cfg = self.config
        if self._captioner is None:
            self._captioner = CaptionSynthesizer(cfg.caption, self._phrase_matcher())
        rng = random.Random(derive_seed(seed, "caption"))
        captions, reason = self._captioner.synthesize(rec.captions, removal.removed, removal.present, synthetic, rng)
        if reason:
            yield Skip(reason, detail=f"image {rec.image_id}, removing {list(removal.removed)}")
            return
        for k, cap in enumerate(captions):
            yield Emit(
                TRAIN_OUT,
                {
                    "row_id": f"{rec.image_id}/{removal.anchor}/{k}",
                    **edit,
                    "caption": cap.text,
                    "caption_id": cap.source.caption_id if cap.source else None,
                    "original_caption": cap.source.text if cap.source else None,
                    "caption_method": cfg.caption.method,
                    "caption_model": self.model_names()["caption"],
                },
            )


def from_args(args: argparse.Namespace) -> DecorrelationBuilder:
    """The builder of `counterfactory build decorrelation` (`builders.app.registry`) and of
    `accelerate launch` below, from the options (options.py, which never imports this module)."""
    return DecorrelationBuilder(options.config_from_args(args))


if __name__ == "__main__":
    from builders.launch import launch_main

    sys.exit(launch_main(options, from_args))
