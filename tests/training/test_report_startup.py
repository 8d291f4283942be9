"""Start-up of `counterfactory benchmark` (#44): its entry module imports no backend or plotting
library a run may not need, the charts are drawn only once every number is written, and
`--no-plots` draws (and links) none of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from builders.app.cli import main as cli_main

#: scipy.stats and scipy.optimize (0.9 s) serve only a comparison of two models or more.
HEAVY = ("open_clip", "matplotlib", "sentence_transformers", "diffusers", "scipy.stats", "scipy.optimize")


def test_report_entry_module_imports_no_heavy_library():
    code = "import sys, training.report.run; print(sorted(m for m in {!r} if m in sys.modules))".format(HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.e2e
def test_charts_are_drawn_after_the_numbers_are_written(
    tmp_path, coco_fixture_dir, nltk_data_dir, tiny_models_dir, monkeypatch
):
    import training.report.run as run
    from builders.models.profiles import tiny_profile

    cc, out = tmp_path / "cc", tmp_path / "out"
    assert (
        cli_main(
            ["build", "coco-captions", "--coco-root", str(coco_fixture_dir), "--splits", "test", "--output", str(cc)]
        )
        == 0
    )
    drawn: list[tuple[str, bool]] = []

    def recorded(name, draw):
        def wrapper(*args, **kwargs):
            written = (out / "results.jsonl").is_file() and (out / "report.md").is_file()
            drawn.append((name, written))
            return draw(*args, **kwargs)

        return wrapper

    for name in ("plot_histograms", "plot_forest"):
        monkeypatch.setattr(run, name, recorded(name, getattr(run, name)))
    clip = str(tiny_profile(tiny_models_dir).clip)
    argv = ["benchmark", "--model", clip, "--coco", str(cc), "--output", str(out), "--blind-lm", "none"]
    assert cli_main([*argv, "--bootstrap", "20"]) == 0
    # A plain --coco run draws the ITM delta histograms and the forest plot, both after
    # results.jsonl and report.md exist; the report links the charts that were drawn.
    assert sorted(drawn) == [("plot_forest", True), ("plot_histograms", True)]
    report = (out / "report.md").read_text()
    for chart in ("forest-coco.png", "itm_deltas-model0-coco.png"):
        assert chart in report and (out / chart).is_file()


@pytest.mark.e2e
def test_no_plots_writes_the_numbers_and_imports_neither_matplotlib_nor_scipy_stats(
    tmp_path, coco_fixture_dir, nltk_data_dir, tiny_models_dir
):
    """`--no-plots`: results.jsonl and report.md as always, no PNG, no figure linked (report.md
    says none was drawn), and matplotlib never imported (the run in a fresh interpreter). Nor is
    scipy.stats (0.6 s): a one-model report's intervals need only scipy.special's quantiles."""
    import re

    from builders.models.profiles import tiny_profile

    cc, out = tmp_path / "cc", tmp_path / "out"
    build = ["build", "coco-captions", "--coco-root", str(coco_fixture_dir), "--splits", "test", "--output", str(cc)]
    assert cli_main(build) == 0
    clip = str(tiny_profile(tiny_models_dir).clip)
    argv = ["benchmark", "--model", clip, "--coco", str(cc), "--output", str(out), "--bootstrap", "20", "--no-plots"]
    code = (
        "import sys; from builders.app.cli import main; rc = main(sys.argv[1:]); "
        "print('matplotlib imported:', any(m.split('.')[0] == 'matplotlib' for m in sys.modules)); "
        "print('scipy.stats imported:', 'scipy.stats' in sys.modules); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "matplotlib imported: False" in proc.stdout
    assert "scipy.stats imported: False" in proc.stdout
    assert (out / "results.jsonl").stat().st_size > 0
    assert sorted(p.name for p in out.rglob("*.png")) == []
    report = (out / "report.md").read_text()
    assert "recall@1" in report  # the numbers are there
    assert re.findall(r"!\[[^\]]*\]\(([^)]*)\)", report) == []  # no figure linked
    assert "--no-plots" in report
