"""The papers' other evaluations: zero-shot classification and Flickr30k retrieval.

- Zero-shot classification (`--zeroshot [BENCHMARK=]DATASET[:SPLIT]`, repeatable; the
  COCO-Counterfactuals paper's Tables 3-4): an image-classification dataset given as a
  `datasets` Hub id, a saved / parquet folder or an imagefolder (class = sub-folder), with one
  image column and one `ClassLabel` column. Each class's text embedding is the mean of the
  L2-normalised embeddings of its prompts, renormalised; an image is assigned the classes of
  highest cosine similarity. Metrics `zeroshot/NAME/top1`, `top5` and `mean_per_class_recall`
  (the mean over classes with images of each class's top-1 recall), scored in
  training/evaluation.py; this module loads the sets and their prompts.
- The prompts are those of CLIP Benchmark (clip-benchmark), so the numbers are comparable with
  its tables: a dataset named as one of its benchmarks (`cifar10=uoft-cs/cifar10`, or by its
  id or folder name alone: `uoft-cs/cifar10`, `cifar-100`, `ILSVRC/imagenet-1k`, `wds_food101`)
  gets that benchmark's templates (`template.format(c=name)`) and class names, from its
  `en_zeroshot_classification_templates.json` / `en_classnames.json` (training/
  zeroshot_benchmarks.json, MIT): the shipped names by class index where it ships them (the
  dataset must have that many classes, in the torchvision order clip-benchmark reads),
  otherwise the dataset's own names as clip-benchmark reads them (as they are; `_` as a space
  for food101, `_` and `/` for sun397); a benchmark without templates of its own takes
  ImageNet's, as clip-benchmark does. Any other dataset (or `openai=DATASET`) gets the 80
  ImageNet templates of the CLIP paper (Radford et al. 2021, as open_clip ships them:
  `open_clip.zero_shot_metadata.OPENAI_IMAGENET_TEMPLATES`) and its own class names with `_`
  read as a space. run.json's `zeroshot_prompts` says which each set got.
  Every image is decoded once when the set is loaded, before training, by the builders' rule
  (loading_scripts/images.py): one that does not decode or has more than `--max-image-pixels`
  is a counted skip (run.json's `skipped`), and the metrics are those of the others.
- Flickr30k retrieval (`--flickr30k ROOT`, `--flickr30k-split test`): a Flickr30k folder in
  Karpathy's format (loading_scripts/flickr30k.py, read by `training.eval_data.load_flickr30k`),
  its 1,000 test images x their 5 captions, scored by the COCO retrieval code (`training.evaluation.retrieval_metrics`, the same recall
  implementation): `flickr30k/text_retrieval_recall@K` (i2t),
`flickr30k/image_retrieval_recall@K` (t2i), clip_benchmark's keys.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from builders.engine.dataset_source import open_split
from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS, ImageProblem, open_rgb_image
from training.config import SourceRef
from training.mixtures import ExampleSet
from training.sources import DataInputError, TableRecord, column_values, require_image_bytes, resolve_commit

log = logging.getLogger(__name__)

ZEROSHOT_FLAG = "--zeroshot"
#: Rows whose image bytes are held at once while the images are checked.
_PAGE = 256
#: `BENCHMARK=` of the CLIP paper's 80 ImageNet templates with the dataset's own class names.
OPENAI = "openai"
#: clip-benchmark's templates and class names (see the module docstring).
BENCHMARKS_FILE = Path(__file__).with_name("zeroshot_benchmarks.json")
#: Characters clip-benchmark reads as spaces in a benchmark's own class names
#: (clip_benchmark/datasets/builder.py); the others keep their names as they are.
_OWN_NAME_SPACES = {"food101": "_", "sun397": "_/"}


def prompt_templates() -> tuple:
    """The CLIP paper's 80 ImageNet prompt templates (callables class name -> prompt)."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return tuple(OPENAI_IMAGENET_TEMPLATES)


@functools.cache
def benchmarks() -> dict:
    """clip-benchmark's {"templates": {name: [...]}, "classnames": {name: [...]}}."""
    return json.loads(BENCHMARKS_FILE.read_text(encoding="utf-8"))


def benchmark_names() -> list[str]:
    b = benchmarks()
    return sorted(set(b["templates"]) | set(b["classnames"]))


class _Format:
    """A clip-benchmark template as a callable (picklable, unlike a lambda)."""

    def __init__(self, template: str) -> None:
        self.template = template

    def __call__(self, classname: str) -> str:
        return self.template.format(c=classname)


def benchmark_templates(name: str) -> tuple:
    """clip-benchmark's templates of benchmark `name` (ImageNet's where it has none)."""
    templates = benchmarks()["templates"]
    return tuple(_Format(t) for t in templates.get(name, templates["imagenet1k"]))


def _benchmark_key(text: str) -> str:
    """`uoft-cs/cifar10`, `CIFAR-10`, `wds_cifar10` -> `cifar10`: the last path component,
    lower case, clip-benchmark's `wds_` mirror prefix dropped, only letters and digits kept."""
    last = text.rstrip("/").rsplit("/", 1)[-1].lower()
    last = last.removeprefix("wds_").removeprefix("wds-")
    return re.sub(r"[^a-z0-9]", "", last)


def split_benchmark(spec: str) -> tuple[str | None, str]:
    """`[BENCHMARK=]DATASET[:SPLIT]` -> (the benchmark named, or None; the rest). An `=` belongs
    to the dataset when the whole spec is an existing path; an unknown name is one line."""
    name, sep, rest = spec.partition("=")
    if not sep or Path(spec).exists():
        return None, spec
    known = benchmark_names()
    if name != OPENAI and name not in known:
        raise DataInputError(
            f"{ZEROSHOT_FLAG} {spec}: {name!r} is not a clip-benchmark dataset; give "
            f"one of {', '.join(known)}, or {OPENAI}=DATASET for CLIP's 80 ImageNet "
            "templates and the dataset's own class names"
        )
    return name, rest


def _prompts_of(named: str | None, path: str, where: str, own: list[str]) -> tuple[str, list[str], tuple]:
    """(which prompts, class names, templates) of a set: the benchmark `named`, else the one its
    id or folder name is, else CLIP's ImageNet templates with its own names."""
    key = _benchmark_key(path)
    name = named or (key if key in benchmark_names() else OPENAI)
    if name == OPENAI:
        return "openai_imagenet_templates", [n.replace("_", " ") for n in own], prompt_templates()
    shipped = benchmarks()["classnames"].get(name)
    if shipped is not None and len(shipped) != len(own):
        raise DataInputError(
            f"{ZEROSHOT_FLAG} {where}: read as clip-benchmark's {name}, whose "
            f"{len(shipped)} class names go by class index, but it has {len(own)} "
            f"classes; give {OPENAI}={path} for CLIP's ImageNet templates and its own "
            "class names, or the benchmark's dataset"
        )
    names = (
        list(shipped)
        if shipped is not None
        else [re.sub(f"[{re.escape(_OWN_NAME_SPACES[name])}]", " ", n) if name in _OWN_NAME_SPACES else n for n in own]
    )
    return f"clip_benchmark:{name}", names, benchmark_templates(name)


@dataclass
class ZeroShotSet:
    """One classification split: images (as examples), their labels and the class names."""

    name: str
    examples: ExampleSet
    labels: np.ndarray
    classnames: list[str]
    #: Callables class name -> prompt; `prompts` says whose (run.json's `zeroshot_prompts`).
    templates: tuple = ()
    prompts: str = "openai_imagenet_templates"
    #: What was read, for run.json's `tables`.
    record: TableRecord | None = None
    #: Images left out, by reason (`unreadable_image`, `image_too_large`, ...), for run.json's `skipped`.
    skipped: dict[str, int] = field(default_factory=dict)


def skip_counts(sets: list[ZeroShotSet]) -> dict[str, int]:
    """run.json's `skipped` entries of the zero-shot sets: `zeroshot/NAME/REASON` -> images."""
    return {f"zeroshot/{z.name}/{reason}": n for z in sets for reason, n in z.skipped.items()}


def prompt_sources(sets: list[ZeroShotSet]) -> dict[str, str]:
    """run.json's `zeroshot_prompts`: set name -> `clip_benchmark:NAME` or `openai_imagenet_templates`."""
    return {z.name: z.prompts for z in sets}


def parse_spec(spec: str) -> tuple[str, str]:
    """`DATASET[:SPLIT]` -> (dataset, split); the split defaults to `test`. A colon belongs to
    the dataset when the whole spec is an existing path."""
    if ":" in spec and not Path(spec).exists():
        path, split = spec.rsplit(":", 1)
        return path, split
    return spec, "test"


def _column_of(ds: datasets.Dataset, kind: type, where: str, what: str) -> str:
    columns = [c for c, f in ds.features.items() if isinstance(f, kind)]
    if not columns:
        raise DataInputError(
            f"{ZEROSHOT_FLAG} {where}: no {what} column (it has {dict(ds.features)}); "
            "give an image-classification dataset (an image and a ClassLabel column)"
        )
    return columns[0]


def _embed_local_images(ds: datasets.Dataset, column: str, root: Path) -> datasets.Dataset:
    """An imagefolder names its files: read the bytes of those inside the folder the user gave
    (a path leading elsewhere keeps no bytes and is refused by `require_image_bytes`)."""
    root = root.resolve()

    def embed(batch):
        cells = []
        for cell in batch[column]:
            path = Path(cell["path"]).resolve() if cell and cell.get("path") and not cell.get("bytes") else None
            if path is not None and path.is_relative_to(root) and path.is_file():
                cell = {"bytes": path.read_bytes(), "path": None}
            cells.append(cell)
        return {column: cells}

    return ds.map(embed, batched=True, features=ds.features, desc="zero-shot images")


def _decodable_rows(ds: datasets.Dataset, column: str, where: str, max_pixels: int) -> tuple[list[int], Counter]:
    """The rows whose image decodes by the builders' rule (loading_scripts/images.py: garbage
    bytes are `unreadable_image`, more than `max_pixels` from the header `image_too_large`), and
    the others counted by reason; one line when no image is usable."""
    keep: list[int] = []
    skipped: Counter[str] = Counter()
    first: dict[str, int] = {}
    for start in range(0, len(ds), _PAGE):
        for row, cell in enumerate(ds[start : start + _PAGE][column], start):
            try:
                open_rgb_image(cell["bytes"], max_pixels=max_pixels, name=f"row {row}").close()
            except ImageProblem as problem:
                skipped[problem.reason] += 1
                first.setdefault(problem.reason, row)
            else:
                keep.append(row)
    if skipped:
        counts = ", ".join(f"{reason}: {n} (first row {first[reason]})" for reason, n in sorted(skipped.items()))
        if not keep:
            raise DataInputError(
                f"{ZEROSHOT_FLAG} {where}: none of its {len(ds)} images can be used "
                f"({counts}); give a dataset of readable images (raise "
                "--max-image-pixels only for large images you trust)"
            )
        log.warning(
            "%s %s: skipped %d of %d images (%s); the zero-shot metrics are computed on the other %d",
            ZEROSHOT_FLAG,
            where,
            sum(skipped.values()),
            len(ds),
            counts,
            len(keep),
        )
    return keep, skipped


def load_zeroshot_set(spec: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> ZeroShotSet:
    """One `--zeroshot` dataset, checked: one line naming it and the fix if it cannot be used.
    Each image is decoded once here, before training: one that cannot be (or has more than
    `max_pixels`) is left out and counted, as the builders count them."""
    named, spec = split_benchmark(spec)
    path, split = parse_spec(spec)
    where = f"{path} (split {split!r})"

    def cannot_load(err: Exception) -> DataInputError:
        return DataInputError(
            f"{ZEROSHOT_FLAG} {where}: cannot load it ({str(err)[:200]}); give a "
            "datasets id or folder and an existing split as DATASET:SPLIT"
        )

    commit = resolve_commit(SourceRef(path))  # a Hub id's commit, recorded; None for a folder
    ds = open_split(path, None, split, flag=ZEROSHOT_FLAG, cannot_load=cannot_load)
    image = _column_of(ds, datasets.Image, where, "image")
    label = _column_of(ds, datasets.ClassLabel, where, "ClassLabel")
    ds = ds.select_columns([image, label]).cast_column(image, datasets.Image(decode=False))
    if Path(path).is_dir():
        ds = _embed_local_images(ds, image, Path(path))
    require_image_bytes(ds, image, f"{ZEROSHOT_FLAG} {where}")
    rows_read = len(ds)
    keep, skipped = _decodable_rows(ds, image, where, max_pixels)
    if skipped:
        ds = ds.select(keep)
    examples = ExampleSet(tables=[ds])
    for row in range(len(ds)):
        examples.add(0, row, image, "", None, -1, "zeroshot")
    prompts, classnames, templates = _prompts_of(named, path, where, list(ds.features[label].names))
    name = f"{Path(path).name or path}-{split}"
    log.info(
        "zero-shot set %s: %d images, %d classes, prompts %s (%d templates)",
        name,
        len(ds),
        len(classnames),
        prompts,
        len(templates),
    )
    record = TableRecord(path, None, commit, "default", split, rows_read)
    return ZeroShotSet(
        name,
        examples,
        np.asarray(column_values(ds, label), dtype=np.int64),
        classnames,
        templates,
        prompts,
        record,
        dict(skipped),
    )
