"""ITM score deltas on random and counterfactual pairs (evaluate module).

The metric code is in this Space's helper module `deltas`, imported relatively so that
`evaluate.load` downloads it too.
"""

import math
from collections.abc import Sequence

import datasets
import evaluate
import numpy as np

from .deltas import SCORE_NAMES
from .deltas import check_bins
from .deltas import delta_stats
from .deltas import itm_deltas
from .deltas import plot_histograms

_CITATION = """\
@inproceedings{le2023cococounterfactuals,
  title     = {{COCO}-Counterfactuals: Automatically Constructed Counterfactual Examples for Image-Text Pairs},
  author    = {Le, Tiep and Lal, Vasudev and Howard, Phillip},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS) Datasets and Benchmarks Track},
  year      = {2023}
}
"""

_DESCRIPTION = """\
How much does an image-text matching (ITM) model prefer a correct pair over an alternative one?
With G the model's ITM score, (C_o, I_o) a real pair, (C_r, I_r) a random other real pair and
(C_c, I_c^s) a counterfactual pair whose original caption C_o has the synthetic image I_o^s:
IR_r = G(C_r, I_r) - G(C_r, I_o), TR_r = G(C_r, I_r) - G(C_o, I_r),
IR_c = G(C_c, I_c^s) - G(C_c, I_o^s), TR_c = G(C_c, I_c^s) - G(C_o, I_c^s).
A delta > 0 means the model prefers the correct pair; counterfactual alternatives are much harder
than random ones (COCO-Counterfactuals, Figure 3). Reports mean, median, std (ddof=0), fraction
below zero and count of each delta, and can write the histogram figure.
"""

_KWARGS_DESCRIPTION = """
Computes IR_r, TR_r, IR_c and TR_c with their statistics, one row per evaluated pair.

Args:
    g_cr_ir (`list` of `float`): G(C_r, I_r), the random real pair.
    g_cr_io (`list` of `float`): G(C_r, I_o).
    g_co_ir (`list` of `float`): G(C_o, I_r).
    g_cc_ics (`list` of `float`): G(C_c, I_c^s), the counterfactual pair.
    g_cc_ios (`list` of `float`): G(C_c, I_o^s).
    g_co_ics (`list` of `float`): G(C_o, I_c^s).
    histogram_path (`str`, optional): write the histogram figure (png/pdf/svg) there.
    title (`str`, optional): figure title, e.g. the model name (drawn as written: a `$` is a
        dollar sign, not TeX math).
    bins (`int`, defaults to 50): histogram bins, an integer from 1 to 1,000 (a ValueError
        names `bins` otherwise).

    Scores are finite real numbers: a bool, a string, NaN, an infinity, an integer beyond float64
    or a missing column raises a ValueError naming the column (and pair). Step by step:
    `add_batch(g_cr_ir=..., ...)` with the six columns (or `add` for one pair) checks and buffers
    pairs, and `compute(...)` with the optional arguments above scores every buffered pair,
    together with any pairs given to that call.

Returns:
    For each of `IR_r`, `TR_r`, `IR_c`, `TR_c` a dict with `mean`, `median`, `std`,
    `frac_below_zero` and `count`; plus `histogram_path` when a figure was written.

Examples:

    >>> itm = evaluate.load("itm_score_deltas")
    >>> results = itm.compute(
    ...     g_cr_ir=[0.9, 0.8], g_cr_io=[0.1, 0.2], g_co_ir=[0.3, 0.9],
    ...     g_cc_ics=[0.5, 0.4], g_cc_ios=[0.6, 0.1], g_co_ics=[0.2, 0.5],
    ... )
    >>> print({name: round(stats["mean"], 3) for name, stats in results.items()})
    {'IR_r': 0.7, 'TR_r': 0.25, 'IR_c': 0.1, 'TR_c': 0.1}
    >>> print(results["IR_c"]["frac_below_zero"], results["TR_c"]["count"])
    0.5 2
"""

_SCORE = datasets.Value("float64")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ItmScoreDeltas(evaluate.Metric):
    """ITM score deltas (Le et al., 2023)."""

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "g_cr_ir": _SCORE,
                    "g_cr_io": _SCORE,
                    "g_co_ir": _SCORE,
                    "g_cc_ics": _SCORE,
                    "g_cc_ios": _SCORE,
                    "g_co_ics": _SCORE,
                }
            ),
            reference_urls=["https://huggingface.co/datasets/Intel/COCO-Counterfactuals"],
        )

    def add_batch(self, **kwargs):
        """Buffer a batch of pairs for a later `compute()`, checked like `compute`'s inputs."""
        super().add_batch(**_checked_scores(kwargs, "add_batch"))

    def add(self, **kwargs):
        """Buffer one pair for a later `compute()`, checked like `compute`'s inputs."""
        super().add(**_checked_scores(kwargs, "add", single=True))

    def compute(self, **kwargs):
        """Compute the deltas (evaluate appends the argument description below)."""
        if "bins" in kwargs:  # before any pair is buffered or scored
            check_bins(kwargs["bins"])
        if not len(self) and all(kwargs.get(name) is None for name in SCORE_NAMES):
            raise ValueError(_missing_message(SCORE_NAMES) + ", or buffer pairs with add/add_batch before compute()")
        # evaluate's compute sends given scores through `add_batch` (checked there) and then
        # scores every buffered pair.
        return super().compute(**kwargs)

    def _compute(
        self,
        g_cr_ir,
        g_cr_io,
        g_co_ir,
        g_cc_ics,
        g_cc_ios,
        g_co_ics,
        histogram_path=None,
        title=None,
        bins=50,
    ):
        deltas = itm_deltas(
            g_cr_ir=g_cr_ir,
            g_cr_io=g_cr_io,
            g_co_ir=g_co_ir,
            g_cc_ics=g_cc_ics,
            g_cc_ios=g_cc_ios,
            g_co_ics=g_co_ics,
        )
        results = {name: stats.as_dict() for name, stats in delta_stats(deltas).items()}
        if histogram_path is not None:
            path = plot_histograms(deltas, histogram_path, title=title, bins=bins)
            results["histogram_path"] = str(path)
        return results


def _missing_message(missing):
    return (
        f"missing score column(s) {list(missing)}: this module needs all six scores per pair "
        f"({', '.join(SCORE_NAMES)}); to score only the random or only the counterfactual "
        "group, call deltas.itm_score_deltas with the scores you have"
    )


def _checked_scores(columns, method, single=False):
    """The six score columns, torch tensors and pandas columns as numpy; raises naming the column and pair on input
    Arrow would misread (its float64 features read True as 1.0 and "0.5" as 0.5) or reject with
    an unrelated TypeError (a missing column, a bare number)."""
    extra = sorted(set(columns) - set(SCORE_NAMES))
    if extra:
        raise ValueError(f"{method} takes the six score columns only; pass {', '.join(extra)} to compute()")
    missing = [name for name in SCORE_NAMES if columns.get(name) is None]
    if missing:
        raise ValueError(_missing_message(missing))
    checked = {}
    for name in SCORE_NAMES:
        values = columns[name]
        if hasattr(values, "detach"):  # torch tensor
            values = values.detach().cpu().numpy()
        elif hasattr(values, "to_numpy"):  # a pandas column: what evaluate's Space widget sends
            values = values.to_numpy()
        checked[name] = values
        rows = [values] if single else values
        if isinstance(rows, np.ndarray):
            if rows.ndim != 1 or rows.dtype.kind not in "fiu":
                raise ValueError(
                    f"{name} must hold one real-number score per pair, got {rows.dtype} with shape {rows.shape}"
                )
            bad = np.flatnonzero(~np.isfinite(rows))
            if bad.size:
                raise ValueError(f"{_where(name, int(bad[0]), single)} holds {rows[bad[0]].item()!r}; {_FINITE}")
            continue
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
            raise ValueError(f"{name} must be a list with one score per pair, got {type(rows).__name__}")
        for i, value in enumerate(rows):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(
                    f"{_where(name, i, single)} holds {value!r} ({type(value).__name__}); scores are real numbers"
                )
            if not _finite(value):
                text = repr(value)
                text = text if len(text) <= 40 else text[:37] + "..."
                raise ValueError(f"{_where(name, i, single)} holds {text} ({type(value).__name__}); {_FINITE}")
    return checked


_FINITE = "scores are finite real numbers (NaN, infinities and integers beyond float64 have no delta)"


def _where(name, i, single):
    return f"{name} (the added pair)" if single else f"{name}[{i}] (pair {i})"


def _finite(value):
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float64 (Arrow would raise the same, unnamed)
        return False
