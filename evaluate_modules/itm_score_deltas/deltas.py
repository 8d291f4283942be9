"""ITM score deltas on counterfactual and random pairs (Le et al., 2023, COCO-Counterfactuals §4.2.2).

G is a model's image-text matching score. (C_o, I_o) is a real pair, (C_r, I_r) a random other
real pair (I_r != I_o), I_o^s / I_c^s the synthetic images of the original / counterfactual
caption C_o / C_c::

    IR_r = G(C_r, I_r)   - G(C_r, I_o)        IR_c = G(C_c, I_c^s) - G(C_c, I_o^s)
    TR_r = G(C_r, I_r)   - G(C_o, I_r)        TR_c = G(C_c, I_c^s) - G(C_o, I_c^s)

A delta > 0 means the model prefers the correct pair. The argument names spell the pair:
`g_cr_ir` = G(C_r, I_r), `g_cr_io` = G(C_r, I_o), `g_co_ir` = G(C_o, I_r),
`g_cc_ics` = G(C_c, I_c^s), `g_cc_ios` = G(C_c, I_o^s), `g_co_ics` = G(C_o, I_c^s).
A delta is computed when both of its scores are given, so the random and the counterfactual
groups can be evaluated separately (and may have different lengths).

Statistics per delta: mean, median, std (population, ddof=0), frac_below_zero (strictly < 0) and
count. `plot_histograms` draws the four distributions like the paper's Figure 3.

`random_derangement(n, seed)` pairs each of n real pairs with "a random other pair" as the paper
says: a permutation drawn uniformly among those with no fixed point (row i is never paired with
itself), the same for the same seed (counterfactory's evaluation uses `PAIR_SEED`).

Example:
    >>> deltas = itm_deltas(g_cr_ir=[0.9, 0.8], g_cr_io=[0.1, 0.2], g_co_ir=[0.3, 0.9])
    >>> sorted(deltas)
    ['IR_r', 'TR_r']
    >>> stats = delta_stats(deltas)
    >>> round(stats["TR_r"].mean, 3), stats["TR_r"].frac_below_zero, stats["TR_r"].count
    (0.25, 0.5, 2)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

__all__ = [
    "DELTA_NAMES",
    "DeltaStats",
    "MAX_BINS",
    "SCORE_NAMES",
    "check_bins",
    "delta_stats",
    "itm_deltas",
    "itm_score_deltas",
    "plot_histograms",
    "random_derangement",
]

#: delta name -> (correct-pair score argument, alternative-pair score argument)
DELTA_DEFINITIONS: dict[str, tuple[str, str]] = {
    "IR_r": ("g_cr_ir", "g_cr_io"),
    "TR_r": ("g_cr_ir", "g_co_ir"),
    "IR_c": ("g_cc_ics", "g_cc_ios"),
    "TR_c": ("g_cc_ics", "g_co_ics"),
}
DELTA_NAMES: tuple[str, ...] = tuple(DELTA_DEFINITIONS)
#: The six score arguments, in the order of the definitions.
SCORE_NAMES: tuple[str, ...] = ("g_cr_ir", "g_cr_io", "g_co_ir", "g_cc_ics", "g_cc_ios", "g_co_ics")
#: Most histogram bins `plot_histograms` draws: more than a panel's pixels can show. Each bin is
#: a drawn bar (10,000 take half a minute) and memory (a billion would take gigabytes).
MAX_BINS = 1_000
_FORMULAS = {
    "IR_r": "G(C_r, I_r) - G(C_r, I_o)",
    "TR_r": "G(C_r, I_r) - G(C_o, I_r)",
    "IR_c": "G(C_c, I_c^s) - G(C_c, I_o^s)",
    "TR_c": "G(C_c, I_c^s) - G(C_o, I_c^s)",
}


#: The seed of the random other pairs of IR_r / TR_r in counterfactory's evaluation (recorded
#: with the numbers): the same pairs for every model, so their deltas compare.
PAIR_SEED = 0


def random_derangement(n: int, seed: int = PAIR_SEED) -> np.ndarray:
    """A uniformly random permutation of 0..n-1 without fixed points (n >= 2): permutations are
    drawn from `numpy.random.default_rng(seed)` until one has none (about e draws on average)."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 items, got {n}")
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(n)
        if not (perm == np.arange(n)).any():
            return perm


@dataclass(frozen=True)
class DeltaStats:
    mean: float
    median: float
    std: float
    frac_below_zero: float
    count: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _scores(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a 1-D array of numbers: {err}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one score per pair), got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{name} has {bad.size} NaN or infinite scores (first at index {int(bad[0])})")
    return arr


def itm_deltas(
    *,
    g_cr_ir: Any = None,
    g_cr_io: Any = None,
    g_co_ir: Any = None,
    g_cc_ics: Any = None,
    g_cc_ios: Any = None,
    g_co_ics: Any = None,
) -> dict[str, np.ndarray]:
    """The per-pair deltas IR_r, TR_r, IR_c, TR_c for which both scores are given."""
    given = {
        name: _scores(value, name)
        for name, value in dict(
            g_cr_ir=g_cr_ir,
            g_cr_io=g_cr_io,
            g_co_ir=g_co_ir,
            g_cc_ics=g_cc_ics,
            g_cc_ios=g_cc_ios,
            g_co_ics=g_co_ics,
        ).items()
        if value is not None
    }
    deltas: dict[str, np.ndarray] = {}
    for delta, (correct, alternative) in DELTA_DEFINITIONS.items():
        if correct in given and alternative in given:
            a, b = given[correct], given[alternative]
            if a.shape != b.shape:
                raise ValueError(
                    f"length mismatch for {delta} = {_FORMULAS[delta]}: {correct} has {a.size} "
                    f"scores, {alternative} has {b.size}"
                )
            if a.size == 0:
                raise ValueError(f"{delta}: {correct} and {alternative} are empty")
            deltas[delta] = a - b
    used = {arg for d in deltas for arg in DELTA_DEFINITIONS[d]}
    unused = sorted(set(given) - used)
    if unused:
        raise ValueError(
            f"scores {unused} were given without their partner score, so no delta uses them "
            f"(definitions: {', '.join(f'{d} = {f}' for d, f in _FORMULAS.items())})"
        )
    if not deltas:
        raise ValueError(
            "no delta can be computed: give g_cr_ir with g_cr_io / g_co_ir (random pairs) and/or "
            "g_cc_ics with g_cc_ios / g_co_ics (counterfactual pairs)"
        )
    return deltas


def delta_stats(deltas: Mapping[str, Any]) -> dict[str, DeltaStats]:
    """mean, median, std (ddof=0), fraction < 0 and count of each delta distribution."""
    out = {}
    for name, values in deltas.items():
        arr = _scores(values, name)
        if arr.size == 0:
            raise ValueError(f"{name} is empty")
        out[name] = DeltaStats(
            mean=float(arr.mean()),
            median=float(np.median(arr)),
            std=float(arr.std()),
            frac_below_zero=float((arr < 0).mean()),
            count=int(arr.size),
        )
    return out


def itm_score_deltas(**scores: Any) -> dict[str, dict[str, float | int]]:
    """Statistics of the ITM score deltas: {"IR_r": {"mean": ..., ...}, ...} (see `itm_deltas`)."""
    return {name: s.as_dict() for name, s in delta_stats(itm_deltas(**scores)).items()}


def check_bins(bins: Any) -> int:
    """`bins` if it is an integer in 1..MAX_BINS; a ValueError naming `bins` otherwise."""
    if isinstance(bins, (bool, np.bool_)) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be an integer from 1 to {MAX_BINS:,}, got {bins!r}")
    return int(bins)


def plot_histograms(
    deltas: Mapping[str, Any],
    path: Union[str, os.PathLike],
    *,
    title: str | None = None,
    bins: int = 50,
) -> Path:
    """Histogram figure of the deltas (random vs counterfactual, IR and TR panels; paper Fig. 3).

    Panels: image retrieval (IR_r and IR_c overlaid) and text retrieval (TR_r and TR_c
    overlaid), with a dashed line at 0 and each distribution's mean in the legend. Deltas that
    are absent are skipped. `bins` is an integer from 1 to MAX_BINS, and `title` is drawn as
    written (no mathtext: a `$` is a dollar sign). Writes `path` (format from its suffix, e.g.
    .png / .pdf).
    """
    import matplotlib

    bins = check_bins(bins)
    arrays = {name: _scores(v, name) for name, v in deltas.items()}
    unknown = sorted(set(arrays) - set(DELTA_NAMES))
    if unknown:
        raise ValueError(f"unknown delta names {unknown}; expected some of {list(DELTA_NAMES)}")
    if not arrays:
        raise ValueError("no deltas to plot")
    # Text objects read `text.parse_math` when created, tick labels when drawn: all inside.
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw_histograms(arrays, Path(path), title, bins)


def _draw_histograms(arrays: dict[str, np.ndarray], path: Path, title: str | None, bins: int) -> Path:
    # A bare Figure renders with the Agg canvas and leaves pyplot's global backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [p for p in ("IR", "TR") if any(n.startswith(p) for n in arrays)]
    fig = Figure(figsize=(5 * len(panels), 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)
    colors = {"r": "tab:blue", "c": "tab:orange"}
    labels = {"r": "random", "c": "counterfactual"}
    for ax, panel in zip(axes[0], panels, strict=True):
        names = [f"{panel}_{kind}" for kind in ("r", "c") if f"{panel}_{kind}" in arrays]
        edges = np.histogram_bin_edges(np.concatenate([arrays[n] for n in names]), bins=bins)
        for name in names:
            kind = name[-1]
            values = arrays[name]
            ax.hist(
                values,
                bins=edges,
                alpha=0.55,
                color=colors[kind],
                label=f"{name} ({labels[kind]}), mean {values.mean():.3g}",
            )
        ax.axvline(0.0, color="black", linestyle="--", linewidth=1)
        ax.set_xlabel(f"{panel} score difference")
        ax.set_ylabel("pairs")
        ax.set_title({"IR": "image retrieval", "TR": "text retrieval"}[panel])
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
