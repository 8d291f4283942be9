"""Reader of the ECCV Caption, CxC and COCO positives shipped in the `eccv_caption` package.

The PyPI package `eccv_caption` (0.1.0) ships, in `eccv_caption/data/`:

    eccv_{image_to_caption,caption_to_image}.json      ECCV Caption (human-verified + CxC)
    cxc_{image_to_caption,caption_to_image}.json       CrissCrossed Captions
    original_{image_to_caption,caption_to_image}.json  the original COCO pairs (5K test split)
    coco_test_ids.npy                                  the 25,000 test caption ids, in fold order

Each JSON maps a query id (as a string) to its positive ids: image -> caption ids (i2t) and
caption -> image ids (t2i). `read_positives("eccv")` returns them as `Positives`;
`EccvPositivesSource` exposes the same rows as a `datasets` builder class, called directly
(`EccvPositivesSource(config_name="cxc").download_and_prepare(); .as_dataset("t2i")`).

Plausible-match (PM) pseudo-positives, needed for PMRP, are not shipped (> 140 MB). Either read
the official `pm_*.json` files (`read_pm_positives(DIR)`) or compute them from COCO instance
annotations (`pm_positives_from_instances`), the way the PCME / ECCV Caption tooling does.

The readers are those of the map_at_r metric (`counterfactory_metrics.map_at_r.eccv_annotations`, one
source for the metric and the builders); here they raise `InputFileError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import datasets
import numpy as np

from builders.engine.errors import InputFileError
from counterfactory_metrics.map_at_r import eccv_annotations as annotations
from counterfactory_metrics.map_at_r.eccv_annotations import PM_FIX, SOURCES, AnnotationFileError, Positives

__all__ = ["PM_FIX", "SOURCES", "EccvPositivesConfig", "EccvPositivesSource", "Positives",
           "coco_test_caption_ids", "eccv_data_dir", "pm_positives", "pm_positives_from_instances",
           "read_pm_positives", "read_positive_files", "read_positives"]

T = TypeVar("T")


def _user_facing(function: Callable[..., T]) -> Callable[..., T]:
    """`function` raising the CLI's `InputFileError` (one line, exit 2) for bad annotation files."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs) -> T:
        try:
            return function(*args, **kwargs)
        except AnnotationFileError as err:
            raise InputFileError(err.path, err.problem, err.fix) from err

    return wrapper


# The readers live with the map_at_r metric Space (which must run without this package); the
# builders reach them here, with the project's error type.
eccv_data_dir = _user_facing(annotations.eccv_data_dir)
read_positive_files = _user_facing(annotations.read_positive_files)
read_positives = _user_facing(annotations.read_positives)
read_pm_positives = _user_facing(annotations.read_pm_positives)
coco_test_caption_ids = _user_facing(annotations.coco_test_caption_ids)
pm_positives = annotations.pm_positives
pm_positives_from_instances = _user_facing(annotations.pm_positives_from_instances)


# ----------------------------------------------------------------------------- datasets builder

@dataclass
class EccvPositivesConfig(datasets.BuilderConfig):
    """`name` is a source (eccv, cxc, coco) or `pm` (then `data_dir` holds the pm_*.json files);
    `data_dir` defaults to the installed package's data folder for the shipped sources."""


class EccvPositivesSource(datasets.GeneratorBasedBuilder):
    """Positives as rows (query_id, positive_ids) in splits `i2t` and `t2i`; called directly."""

    BUILDER_CONFIG_CLASS = EccvPositivesConfig
    BUILDER_CONFIGS = [EccvPositivesConfig(name=n) for n in (*SOURCES, "pm")]
    DEFAULT_CONFIG_NAME = "eccv"

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description="Image-to-caption and caption-to-image positives of the COCO 5K test split",
            features=datasets.Features({"query_id": datasets.Value("int64"),
                                        "positive_ids": datasets.List(datasets.Value("int64"))}),
            homepage="https://github.com/naver-ai/eccv-caption")

    def _split_generators(self, dl_manager):
        if self.config.name == "pm":
            if not self.config.data_dir:
                raise InputFileError("data_dir", "the pm config needs data_dir=<folder with "
                                     "pm_*.json>", PM_FIX)
            positives = read_pm_positives(Path(self.config.data_dir))
        else:
            positives = read_positives(self.config.name, self.config.data_dir)
        return [datasets.SplitGenerator(name=name, gen_kwargs={"mapping": mapping})
                for name, mapping in (("i2t", positives.i2t), ("t2i", positives.t2i))]

    def _generate_examples(self, mapping: dict[int, np.ndarray]):
        for query_id, ids in mapping.items():
            yield query_id, {"query_id": query_id, "positive_ids": ids.tolist()}
