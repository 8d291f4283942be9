"""Reader of CrissCrossed Captions' image-caption similarity ratings (SITS CSV files).

CxC (Parekh et al., EACL 2021) rates image-caption pairs of the COCO val/test splits from 0 to 5
(`sits_val.csv`, `sits_test.csv`); rows look like

    caption,image,agg_score,sampling_method
    COCO_val2014:sentid:732091,COCO_val2014_000000365325.jpg,2.2,c2i_intrasim

ECCV Caption merges the CxC pairs scoring at least 3 (the paper's §3.3). The `eccv_caption`
package ships only the resulting ids; these files let a new version apply its own threshold.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from builders.engine.errors import InputFileError
from loading_scripts.eccv import Positives

HEADER = ("caption", "image", "agg_score", "sampling_method")


def read_cxc_sits(paths: Sequence[str | Path], min_score: float = 3.0) -> Positives:
    """Positives = the rated image-caption pairs with `agg_score >= min_score`, both directions."""
    i2t: dict[int, set[int]] = defaultdict(set)
    t2i: dict[int, set[int]] = defaultdict(set)
    for path in map(Path, paths):
        if not path.is_file():
            raise InputFileError(
                path,
                "CxC ratings file is missing",
                "download sits_test.csv / sits_val.csv from google-research-datasets/Crisscrossed-Captions",
            )
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = tuple(next(reader, ()))
            if header[:3] != HEADER[:3]:
                raise InputFileError(
                    path, f"header {list(header)} is not CxC's SITS header", f"expected {','.join(HEADER)}"
                )
            for line, row in enumerate(reader, start=2):
                try:
                    caption = int(row[0].rsplit(":", 1)[-1])
                    image = int(Path(row[1]).stem.rsplit("_", 1)[-1])
                    score = float(row[2])
                except (IndexError, ValueError) as err:
                    raise InputFileError(
                        path, f"row {line}: cannot read caption/image/score from {row} ({err})", "fix or drop the row"
                    ) from err
                if score >= min_score:
                    i2t[image].add(caption)
                    t2i[caption].add(image)
    return Positives(
        i2t={i: np.asarray(sorted(c), dtype=np.int64) for i, c in sorted(i2t.items())},
        t2i={c: np.asarray(sorted(i), dtype=np.int64) for c, i in sorted(t2i.items())},
    )
