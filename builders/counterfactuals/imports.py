"""Imported image pairs (`--images-from`; builders/counterfactuals/METHOD.md §2, "Imported image
pairs"): the rows of the caption pairs' table with the two images that exist for each id, stored
as their bytes, scored with the image stage's CLIP filter.

Work items (`import_items`): each caption pair of `--captions-from` (`pair_tables.PairItem`) with
the names, sizes and zip CRCs of its two images, located by the layout
(`image_sources.Layout`): cheap records, not pixels. An id whose image names climb out, or lead
out of a folder, is `path_outside_root`; an id with one of its two images is `missing_image`
(input errors, counted); an id with neither is `no_imported_images` (filtered: the published
caption-pair .tsv holds every caption pair, the release only the pairs whose images passed).

`ImportStage.run` reads a part's images `SCORE_BATCH` pairs at a time: each file's bytes are
checked by `loading_scripts.images.open_rgb_image` (decodable, pixel bound, mode policy; a broken
image is a counted input error under its reason) and stored unchanged (`{"bytes", "path": None}`:
never re-encoded; `--strip-metadata` drops EXIF, XMP and comments losslessly,
`loading_scripts/image_metadata.py`); the decoded RGB copies only feed CLIP (`images.row_scores`: the generation
path's text-image, image-image and directional scores; null without `clip_scores`) and are
dropped after their batch. A part's image bytes are bounded (`PART_IMAGE_BYTES`): a pair past
it is `part_too_large`, an input error naming `--part-size`. With `apply_filters` a pair failing the image stage's filters at its
thresholds is dropped (`imported_pair_failed_clip`, counted per filter as the generation path
counts candidates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from builders.counterfactuals.config import IMAGE_FILTERS, ImageImportConfig, ImageStageConfig
from builders.counterfactuals.image_sources import FolderSource, ImageRef, Layout, ZipSource, climbs
from builders.counterfactuals.pair_tables import PairItem
from builders.counterfactuals.schema import GENERATION_COLUMNS
from builders.engine import progress
from builders.engine.contained_paths import PATH_OUTSIDE_ROOT, PathOutsideRoot
from builders.engine.errors import InputProblem, UserFacingError
from builders.engine.sharding.base import Count, Emit, Skip

NO_IMPORTED_IMAGES = "no_imported_images"
MISSING_IMAGE = "missing_image"
IMPORTED_PAIR_FAILED_CLIP = "imported_pair_failed_clip"
#: A pair that would take its part's image bytes past `PART_IMAGE_BYTES` (an input error).
PART_TOO_LARGE = "part_too_large"
#: An image `--strip-metadata` cannot rewrite (neither JPEG nor PNG, or malformed segments).
METADATA_NOT_STRIPPED = "metadata_not_stripped"
#: Pairs read, decoded and scored at a time: 2 x 16 decoded 512 x 512 images (~25 MB) at most.
SCORE_BATCH = 16
#: The image bytes one part holds (the runner keeps a part's rows until it writes them, and
#: writing copies them a few times): 256 MiB, 11 times a part of 64 of the release's pairs
#: (2 x 183 kB each). Each file is bounded too (`--max-image-bytes`), so a part never holds
#: more than this plus one pair.
PART_IMAGE_BYTES = 256 << 20


@dataclass
class ImportItem:
    """One caption pair and where its images are (`None`: not there): a work item."""

    id: str | None
    row: dict[str, Any]
    images: tuple[ImageRef | None, ImageRef | None] = (None, None)
    input_problem: InputProblem | None = None


def import_items(pairs: Iterable[PairItem], source: FolderSource | ZipSource, layout: Layout) -> Iterator[ImportItem]:
    """Each caption pair with its located images, in table order (a stream). A table none of
    whose ids has an image under the layout is one line: the wrong layout or the wrong files."""
    looked = found = 0
    first = ""
    for pair in pairs:
        if pair.input_problem is not None or pair.id is None:
            yield ImportItem(pair.id, {}, input_problem=pair.input_problem)
            continue
        refs, problem = locate(source, layout, pair.id)
        looked += 1
        found += any(refs)
        first = first or " or ".join(layout.names(pair.id, 0))
        yield ImportItem(pair.id, pair.row, refs, problem)
    if looked and not found:
        raise UserFacingError(
            f"--images-from {source.label}: none of the {looked:,} caption pairs "
            f"has an image named as the {layout.name} layout says (the first "
            f"id's image 0 would be {first}); check --images-layout / "
            "--images-pattern and that the ids are those of the images"
        )


def locate(
    source: FolderSource | ZipSource, layout: Layout, row_id: str
) -> tuple[tuple[ImageRef | None, ImageRef | None], InputProblem | None]:
    """Row `row_id`'s two images (the first candidate name that is there), or why it has none."""
    refs: list[ImageRef | None] = []
    for n in (0, 1):
        names = layout.names(row_id, n)
        if any(climbs(name) for name in names):
            return (None, None), InputProblem(
                PATH_OUTSIDE_ROOT,
                (
                    f"id {row_id!r}: its image name {names[0]!r} climbs out of {source.label} (a `..` "
                    "component, a NUL or an absolute name): never looked up"
                ),
            )
        ref = None
        for name in names:
            try:
                ref = source.find(name)
            except PathOutsideRoot as err:
                return (None, None), InputProblem(PATH_OUTSIDE_ROOT, f"id {row_id!r}: {err}")
            if ref is not None:
                break
        refs.append(ref)
    pair = (refs[0], refs[1])
    if (pair[0] is None) != (pair[1] is None):
        have, n = (pair[1], 0) if pair[0] is None else (pair[0], 1)
        return pair, InputProblem(
            MISSING_IMAGE,
            f"id {row_id!r}: {source.label} has {have.name} "
            f"but not image {n} ({' or '.join(layout.names(row_id, n))})",
        )
    return pair, None


class ImportStage:
    """`run(items)`: the rows of a part's imported pairs (see the module docstring)."""

    def __init__(
        self,
        source: FolderSource | ZipSource,
        scorer: Any,
        images: ImageStageConfig,
        config: ImageImportConfig,
        output: str,
        clip_model: str | None,
    ) -> None:
        self.source, self.scorer, self.images, self.config = source, scorer, images, config
        self.output, self.clip_model = output, clip_model
        self._part_bytes = 0  # the image bytes of the rows of the part `run` is on

    def run(self, items: Sequence[ImportItem]) -> Iterator[Emit | Skip | Count]:
        """The rows of one part (`items`: the runner calls this once per part)."""
        self._part_bytes = 0
        progress.stage("imported pairs", 0, len(items))
        for start in range(0, len(items), SCORE_BATCH):
            yield from self._batch(items[start : start + SCORE_BATCH])
            progress.stage("imported pairs", min(start + SCORE_BATCH, len(items)), len(items))

    def _batch(self, items: Sequence[ImportItem]) -> Iterator[Emit | Skip | Count]:
        from builders.counterfactuals.images import failed_filters, row_scores
        from loading_scripts.images import ImageProblem

        loaded = []
        for item in items:
            ref_0, ref_1 = item.images
            if ref_0 is None or ref_1 is None:  # neither (one alone is the reader's missing_image)
                yield Skip(NO_IMPORTED_IMAGES, detail=f"id {item.id!r}: no image in {self.source.label}")
                continue
            over = self._over_part_budget(ref_0.size + ref_1.size)
            if over:
                yield Skip(PART_TOO_LARGE, kind="error", detail=f"id {item.id!r}: {over}")
                continue
            try:
                data = [self.source.read(ref_0), self.source.read(ref_1)]
                pixels = [self._checked(ref_0, data[0]), self._checked(ref_1, data[1])]
                if self.config.strip_metadata:
                    data = [self._stripped(ref_0, data[0]), self._stripped(ref_1, data[1])]
            except ImageProblem as err:
                yield Skip(err.reason, kind="error", detail=f"id {item.id!r}: {err}")
                continue
            self._part_bytes += len(data[0]) + len(data[1])  # held until the part is written
            loaded.append((item, data, pixels))
        if not loaded:
            return
        scores = None
        if self.config.clip_scores:
            scores = row_scores(
                self.scorer,
                [it.row["caption_0"] for it, _, _ in loaded],
                [it.row["caption_1"] for it, _, _ in loaded],
                [p[0] for _, _, p in loaded],
                [p[1] for _, _, p in loaded],
            )
            yield Count("imported_pairs_scored", len(loaded))
        applied = self.images.filters if self.config.apply_filters else ()
        rejected = dict.fromkeys(applied, 0)  # zeros too: the card tells 0 from not applied
        for k, (item, data, _) in enumerate(loaded):
            failed = failed_filters(self.images, scores, k) if applied else []
            for name in failed:
                rejected[name] += 1
            if failed:
                yield Skip(IMPORTED_PAIR_FAILED_CLIP, detail=f"id {item.id!r} fails {', '.join(failed)}")
                continue
            yield Emit(self.output, self._row(item, data, scores, k))
        for name, n in rejected.items():
            yield Count(f"image_rejected_{name}", n)

    def _over_part_budget(self, pair_bytes: int) -> str | None:
        """Why a pair of `pair_bytes` does not fit in this part, or None (the first pair always
        fits: each file is bounded by --max-image-bytes)."""
        if not self._part_bytes or self._part_bytes + pair_bytes <= PART_IMAGE_BYTES:
            return None
        return (
            f"its images ({pair_bytes:,} bytes) would take the part's past {PART_IMAGE_BYTES:,} "
            "bytes; give a smaller --part-size (or a smaller --max-image-bytes, if these are not real images)"
        )

    def _stripped(self, ref: ImageRef, data: bytes) -> bytes:
        from loading_scripts.image_metadata import MetadataNotStripped, strip_metadata
        from loading_scripts.images import ImageProblem

        try:
            return strip_metadata(data)
        except MetadataNotStripped as err:
            raise ImageProblem(
                f"{self.source.label}:{ref.name}",
                METADATA_NOT_STRIPPED,
                f"--strip-metadata cannot drop its metadata: {err}",
                "convert the image to JPEG or PNG, or leave out --strip-metadata",
            ) from None

    def _checked(self, ref: ImageRef, data: bytes):
        from loading_scripts.images import open_rgb_image

        return open_rgb_image(data, max_pixels=self.config.max_image_pixels, name=f"{self.source.label}:{ref.name}")

    def _row(self, item: ImportItem, data: list[bytes], scores: Any, k: int) -> dict[str, Any]:
        """The `default` row: the table's caption columns, the bytes as stored in the source,
        the CLIP scores (null when not scored); what only a generation knows (seed, p, guidance,
        candidates, the generator) is null."""
        clip = (
            dict.fromkeys(("clip_score_0", "clip_score_1", "clip_directional", "clip_image_similarity"))
            if scores is None
            else {
                "clip_score_0": scores.clip_0[k].item(),
                "clip_score_1": scores.clip_1[k].item(),
                "clip_directional": scores.directional[k].item(),
                "clip_image_similarity": scores.image_similarity[k].item(),
            }
        )
        return {
            **item.row,
            "image_0": {"bytes": data[0], "path": None},
            "image_1": {"bytes": data[1], "path": None},
            "seed": None,
            "p": None,
            "guidance_scale": None,
            **clip,
            "image_candidates_tried": None,
            "image_candidates_passed": None,
            **{f"image_rejected_{name}": None for name in IMAGE_FILTERS},
            "sd_model": None,
            "clip_model": self.clip_model,
            **dict.fromkeys(GENERATION_COLUMNS),
        }
