"""Several seeds of one finetuning command, mean ± std per metric, and a one-tailed Welch t-test
against a baseline sweep (the COCO-Counterfactuals paper's protocol: 25 seeds, 107-131 with
data seeds 108-132, Le et al. 2023 §5.1).

    python training/sweep.py --seeds 107-131 --data-seed-offset 1 --output runs/real-only \
        -- --real ORG/coco-captions --counterfactuals ORG/cf --mix cf:real --recipe le2023 ...
    python training/sweep.py --seeds 107-131 --data-seed-offset 1 --output runs/medium \
        --baseline runs/real-only -- --real ORG/coco-captions --counterfactuals ORG/cf --mix cf:medium ...

(`cf:real` is the paper's real-only baseline: the same real rows without the synthetic pairs.)

Each seed trains into OUTPUT/seed-N (a seed whose run finished is not re-run, and an
interrupted one continues with `--resume latest`, refused if its flags differ). OUTPUT/summary.json
holds the final metrics of every seed finished under OUTPUT;
summary.md the table (mean ± std; the gain of finetuning, each seed's final value minus its base
model's before step 1 (run.json's `before_after`), as mean ± std over seeds with the two-sided
p-value of a paired t-test across seeds (after vs before); with `--baseline` the baseline's mean ±
std and the one-tailed p-value of "better than the baseline": higher, or lower for the metrics of
`LOWER_IS_BETTER`; a metric of an evaluation set that overlapped training in any seed,
`--allow-eval-overlap`, is marked as in metrics.md); summary.png one panel per metric. `--summarize-only` (no `--seeds` needed)
rewrites these from the seeds finished so far.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from pathlib import Path

import numpy as np

from builders.engine.errors import UserFacingError, run_handled
from builders.engine.no_follow import RootDir
from builders.engine.option_types import SEED_LIMIT
from builders.viewer.plots import plain_text
from training.options import build_parser, build_sweep_parser, config_from_args
from training.run_root import RunRoot

log = logging.getLogger(__name__)

#: Name parts of the metrics where lower is better: losses, and the fraction of ITM deltas below
#: zero (pairs where the model prefers the wrong image or caption;
#: builders/counterfactuals/METHOD.md §4). Every other metric (R@K, ECCV mAP@R / R-P, ODmAP@k,
#: ITM delta mean / median, necessity PN) is higher-is-better.
LOWER_IS_BETTER = ("loss", "frac_below_zero")


def higher_is_better(metric: str) -> bool:
    return not any(part in metric for part in LOWER_IS_BETTER)


#: More seeds than any sweep runs (the paper's has 25): a typo such as 1-99999999999 is refused
#: instead of building a list that fills the memory.
MAX_SEEDS = 10_000


def parse_seeds(text: str) -> list[int]:
    """`107-131` or `1,2,5`: at most `MAX_SEEDS` seeds, a range from low to high."""
    usage = "give a range like 107-131 or a list like 1,2,5"
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            if hi < lo:
                raise UserFacingError(f"--seeds {text[:100]}: the range is empty (it ends before it starts); {usage}")
            count = hi - lo + 1
        else:
            seeds = [int(x) for x in text.split(",")]
            count = len(seeds)
    except ValueError:
        raise UserFacingError(f"--seeds {text[:100]!r}: {usage}") from None
    if count > MAX_SEEDS:
        raise UserFacingError(
            f"--seeds {text[:100]}: {count:,} seeds, more than a sweep may run ({MAX_SEEDS:,}); give fewer seeds"
        )
    seeds = list(range(lo, hi + 1)) if "-" in text else seeds
    check_seeds(seeds, f"--seeds {text[:100]}")
    return seeds


def check_seeds(seeds: list[int], what: str) -> None:
    """Every seed one `--seed` takes (`option_types.seed_int`), before the first seed runs."""
    if min(seeds) < 0 or max(seeds) >= SEED_LIMIT:
        raise UserFacingError(f"{what}: every seed must be between 0 and {SEED_LIMIT - 1} (32-bit seeds)")


def run_seeds(seeds: list[int], output: Path, train_args: list[str], data_seed_offset: int | None) -> None:
    from training.trainer import run

    for seed in seeds:
        out = output / f"seed-{seed}"
        if (out / "run.json").is_file() and "final_metrics" in json.loads((out / "run.json").read_text()):
            log.info("seed %d already finished in %s", seed, out)
            continue
        args = [*train_args, "--seed", str(seed), "--output", str(out)]
        if out.is_dir() and any(out.iterdir()) and "--overwrite-output-dir" not in train_args:
            args += ["--resume", "latest"]  # an interrupted seed: continued, if the same run
        if data_seed_offset is not None:
            args += ["--data-seed", str(seed + data_seed_offset)]
        run(config_from_args(build_parser().parse_args(args)))


def collect_gains(output: Path) -> dict[str, dict[str, float]]:
    """seed folder name -> metric -> final minus before step 1, of every finished seed whose
    run evaluated its base model (run.json's `before_after`)."""
    out = {}
    for run_json in sorted(output.glob("seed-*/run.json")):
        record = json.loads(run_json.read_text())
        if "final_metrics" in record and record.get("before_after"):
            out[run_json.parent.name] = {k: v["difference"] for k, v in record["before_after"].items()}
    return out


def paired_gain_pvalue(gains: np.ndarray) -> float:
    """Two-sided p-value of the paired t-test of after vs before across seeds (the gains' mean is
    0 under the null); NaN with fewer than 2 seeds."""
    from scipy import stats

    if len(gains) < 2:
        return float("nan")
    return float(stats.ttest_1samp(gains, 0.0).pvalue)


def collect(output: Path) -> dict[str, dict[str, float]]:
    """seed folder name -> final metrics of every finished seed under `output`."""
    out = {}
    for run_json in sorted(output.glob("seed-*/run.json")):
        record = json.loads(run_json.read_text())
        if "final_metrics" in record:
            out[run_json.parent.name] = record["final_metrics"]
    if not out:
        raise UserFacingError(f"{output}: no finished seed-*/run.json; run the sweep first")
    return out


def welch_one_tailed(a: np.ndarray, b: np.ndarray, greater: bool) -> float:
    """p-value of Welch's t-test, H1: mean(a) > mean(b) (or < when not `greater`)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return float("nan")
    return float(stats.ttest_ind(a, b, equal_var=False, alternative="greater" if greater else "less").pvalue)


def summarize(output: Path, baseline: Path | None = None) -> dict:
    runs = collect(output)
    gains = collect_gains(output)
    base = collect(baseline) if baseline else None
    names = sorted(set.intersection(*(set(m) for m in runs.values())))
    rows = []
    for name in names:
        values = np.array([m[name] for m in runs.values()], dtype=float)
        row = {
            "metric": name,
            "n": len(values),
            "mean": float(values.mean()),
            "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        }
        if gains and all(name in g for g in gains.values()):
            g = np.array([gs[name] for gs in gains.values()], dtype=float)
            row.update(
                gain_n=len(g),
                gain_mean=float(g.mean()),
                gain_std=float(g.std(ddof=1)) if len(g) > 1 else 0.0,
                gain_p=paired_gain_pvalue(g),
            )
        if base is not None and all(name in m for m in base.values()):
            b = np.array([m[name] for m in base.values()], dtype=float)
            greater = higher_is_better(name)
            row.update(
                baseline_mean=float(b.mean()),
                baseline_std=float(b.std(ddof=1)) if len(b) > 1 else 0.0,
                alternative="greater" if greater else "less",
                p_value=welch_one_tailed(values, b, greater=greater),
            )
        rows.append(row)
    summary = {"runs": runs, "gains": gains, "baseline_runs": base, "metrics": rows}
    markdown = _markdown(rows, base is not None, _overlap(output) | (_overlap(baseline) if baseline else {}))
    with RootDir(output) as root:  # each file written whole, never through a link (#49)
        root.write_atomic("summary.json", json.dumps(summary, indent=1).encode())
        root.write_atomic("summary.md", markdown.encode())
        root.write_atomic("summary.png", _plot(rows))
    return summary


def _overlap(output: Path) -> dict[str, dict]:
    """The evaluation sets that overlapped training in any seed under `output` (run.json's
    `eval_overlap`, runs with --allow-eval-overlap), the largest overlap per set."""
    out: dict[str, dict] = {}
    for run_json in sorted(output.glob("seed-*/run.json")):
        for key, o in json.loads(run_json.read_text()).get("eval_overlap", {}).items():
            if key not in out or o["shared"] > out[key]["shared"]:
                out[key] = o
    return out


def _markdown(rows: list[dict], with_baseline: bool, overlap: dict[str, dict] | None = None) -> str:
    from training.leakage import mark_overlapping
    from training.report.markdown import plain  # metric names come from data: plain text

    shown = list(mark_overlapping({r["metric"]: 0.0 for r in rows}, overlap or {}))
    with_gain = any("gain_mean" in r for r in rows)
    head = (
        "| metric | n | mean ± std |"
        + (" gain (after - before) mean ± std | paired p |" if with_gain else "")
        + (" baseline mean ± std | H1 | one-tailed p |" if with_baseline else "")
    )
    sep = "|---|---|---|" + ("---|---|" if with_gain else "") + ("---|---|---|" if with_baseline else "")
    lines = [head, sep]
    for r, name in zip(rows, shown, strict=True):
        line = f"| {plain(name)} | {r['n']} | {r['mean']:.4f} ± {r['std']:.4f} |"
        if with_gain:
            line += (
                f" {r['gain_mean']:+.4f} ± {r['gain_std']:.4f} | {r['gain_p']:.4g} |"
                if "gain_mean" in r
                else " - | - |"
            )
        if with_baseline:
            h1 = "run > baseline" if r.get("alternative") == "greater" else "run < baseline"
            line += (
                f" {r['baseline_mean']:.4f} ± {r['baseline_std']:.4f} | {h1} | {r['p_value']:.4g} |"
                if "p_value" in r
                else " - | - | - |"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


@plain_text  # metric names are drawn as written
def _plot(rows: list[dict]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(rows))
    cols = min(4, n)
    fig, axes = plt.subplots(
        (n + cols - 1) // cols, cols, figsize=(3 * cols, 2.5 * ((n + cols - 1) // cols)), squeeze=False
    )
    for ax, r in zip(axes.flat, rows, strict=False):
        labels, means, stds = ["run"], [r["mean"]], [r["std"]]
        if "baseline_mean" in r:
            labels.insert(0, "baseline")
            means.insert(0, r["baseline_mean"])
            stds.insert(0, r["baseline_std"])
        ax.bar(labels, means, yerr=stds, capsize=4, color=["#999999", "#3366cc"][-len(labels) :])
        title = r["metric"] + (f"\np={r['p_value']:.3g}" if "p_value" in r else "")
        ax.set_title(title, fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()


def sweep(args: argparse.Namespace) -> int:
    """The handler of this script and of `counterfactory sweep` (flags: training/options.py)."""
    output = Path(args.output)
    if args.summarize_only and args.seeds is not None:
        # The summary always covers every finished seed under --output (as after a sweep).
        log.warning(
            "--summarize-only summarises every finished seed under %s; --seeds %s is unused", output, args.seeds
        )
    if output.is_dir():  # the seeds' run folders and the summary: none written through a link (#49)
        with RunRoot(output) as root:
            root.refuse_links("sweep --output")
    if not args.summarize_only:
        if args.seeds is None:
            raise UserFacingError(
                "--seeds is needed to run a sweep (e.g. --seeds 107-131); "
                "to summarise the finished seeds only, pass --summarize-only"
            )
        seeds = parse_seeds(args.seeds)
        if args.data_seed_offset is not None:
            check_seeds([s + args.data_seed_offset for s in seeds], f"--data-seed-offset {args.data_seed_offset}")
        run_seeds(seeds, output, args.train_args, args.data_seed_offset)
    summarize(output, Path(args.baseline) if args.baseline else None)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_sweep_parser()
    parser.set_defaults(func=sweep)
    return run_handled(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
