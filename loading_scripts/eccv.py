"""Reader of the ECCV Caption, CxC and COCO positives shipped in the `eccv_caption` package.

The PyPI package `eccv_caption` (0.1.0) ships, in `eccv_caption/data/`:

    eccv_{image_to_caption,caption_to_image}.json      ECCV Caption (human-verified + CxC)
    cxc_{image_to_caption,caption_to_image}.json       CrissCrossed Captions
    original_{image_to_caption,caption_to_image}.json  the original COCO pairs (5K test split)
    coco_test_ids.npy                                  the 25,000 test caption ids, in fold order

Each JSON maps a query id (as a string) to its positive ids: image -> caption ids (i2t) and
caption -> image ids (t2i). `read_positives("eccv")` returns them as `Positives`.

Plausible-match (PM) pseudo-positives, needed for PMRP, are not shipped (> 140 MB). Either read
the official `pm_*.json` files (`read_pm_positives(DIR)`) or compute them from COCO instance
annotations (`pm_positives_from_instances`), the way the PCME / ECCV Caption tooling does.

The readers are those of the map_at_r metric (`counterfactory_metrics.map_at_r.eccv_annotations`, one
source for the metric and the builders); here they raise `InputFileError`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from builders.engine.errors import InputFileError
from counterfactory_metrics.map_at_r import eccv_annotations as annotations
from counterfactory_metrics.map_at_r.eccv_annotations import PM_FIX, SOURCES, AnnotationFileError, Positives

__all__ = [
    "PM_FIX",
    "SOURCES",
    "Positives",
    "coco_test_caption_ids",
    "eccv_data_dir",
    "pm_positives",
    "pm_positives_from_instances",
    "read_pm_positives",
    "read_positive_files",
    "read_positives",
]

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
