"""`counterfactory benchmark` numbers a reviewer can trust (#35): intervals on every number with
units, paired comparisons marking ties, floors (chance levels, the blind text-only baseline,
same-word pairs), exact provenance (code version, metric module digests, no local path in any
figure), clip-benchmark's vocabulary, and bad input in the report's datasets as one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from builders.app.cli import main as cli_main
from helpers.build_helpers import error_line
from helpers.training_helpers import report_builds

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    return report_builds(tmp_path_factory.mktemp("builds"), coco_fixture_dir)


class FigureTexts:
    """Every text drawn in a figure saved while it is installed (titles, labels, ticks)."""

    def __init__(self, monkeypatch) -> None:
        from matplotlib.figure import Figure

        self.texts: list[str] = []
        save = Figure.savefig

        def savefig(fig, *args, **kwargs):
            result = save(fig, *args, **kwargs)  # drawn first: tick labels exist
            from matplotlib.text import Text

            self.texts += [t.get_text() for t in fig.findobj(Text) if t.get_text()]
            return result

        monkeypatch.setattr(Figure, "savefig", savefig)


@pytest.fixture(scope="module")
def report(builds, tiny_models_dir, tmp_path_factory):
    """Both tiny CLIPs, spelled as paths (the open_clip one as `local-dir:/abs/path`), every
    figure's text captured."""
    from builders.models.profiles import tiny_profile

    mp = pytest.MonkeyPatch()
    texts = FigureTexts(mp)
    cc, dec, cf = builds
    profile = tiny_profile(tiny_models_dir)
    out = tmp_path_factory.mktemp("report") / "out"
    try:
        assert (
            cli_main(
                [
                    "benchmark",
                    "--model",
                    profile.clip,
                    "--model",
                    profile.open_clip,
                    "--blind-lm",
                    profile.lm,
                    "--coco",
                    str(cc),
                    "--decorrelation",
                    str(dec),
                    "--counterfactuals",
                    str(cf),
                    "--bootstrap",
                    "200",
                    "--seed",
                    "3",
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
    finally:
        mp.undo()
    return out, texts.texts


def _records(out: Path) -> list[dict]:
    from training.report.results import read_results

    return read_results(out / "results.jsonl")


def test_every_number_with_units_has_its_interval(report):
    out, _ = report
    records = [r for r in _records(out) if r["task"] != "blind_baseline"]
    assert {r["task"] for r in records} >= {"zeroshot_retrieval", "itm", "odmap", "odmap_per_class", "necessity"}
    for r in records:
        assert (r["bootstrap"], r["seed"]) == (200, 3)
        for name, value in r["metrics"].items():
            low, high, n = r["ci_low"][name], r["ci_high"][name], r["n_units"][name]
            if value is None or low is None:  # a class no resample drew stays without one
                continue
            assert low - 1e-12 <= value <= high + 1e-12, (r["task"], name)
            assert n > 0
    md = (out / "report.md").read_text()
    assert re.search(r"\| \d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]", md)
    assert "-0.0000" not in md


#: The values a metric can take, by its name (independent of the code's `bounds`): recalls,
#: fractions and ODmAP lie in [0, 1], so their paired differences in [-1, 1]; ITM delta means
#: and medians and PN are not bounded by their definition.
_BOUNDED = re.compile(r"recall@|frac_below_zero|prefers_original|ODmAP|top\d")


def test_every_interval_the_report_prints_lies_in_its_metrics_range(report):
    """Every interval of results.jsonl and every paired difference of report.md (both families)
    inside what its metric can take (#50: R@1's difference was -0.1333 [-1.4667, 0.1559],
    ODmAP@1 0.2000 [-0.1498, 2.2000] on this fixture)."""
    out, _ = report
    checked = 0
    for r in _records(out):
        for name, low in r["ci_low"].items():
            if low is not None and _BOUNDED.search(name):
                assert 0 <= low <= r["ci_high"][name] <= 1, (r["task"], name, low, r["ci_high"][name])
                checked += 1
    rows = re.findall(
        r"^\| (\S+) \|.*\| (-?\d\.\d{4}) \[(-?\d+\.\d{4}), (-?\d+\.\d{4})\] \|", (out / "report.md").read_text(), re.M
    )
    differences = [(m, float(lo), float(hi)) for m, _, lo, hi in rows if _BOUNDED.search(m.replace("\\", ""))]
    assert len(differences) >= 8 and checked >= 20, (len(differences), checked)
    for metric, low, high in differences:
        assert -1 <= low <= high <= 1, (metric, low, high)


def test_every_missing_interval_says_why(report):
    """With resamples, a metric with units but no interval has its reason in `ci_note`, per-class
    numbers included (#50: their notes were null), and its per-model cell shows it."""
    out, _ = report
    md = (out / "report.md").read_text()
    missing = 0
    for r in (r for r in _records(out) if r["task"] != "blind_baseline" or r["n_units"]):
        for name, value in r["metrics"].items():
            if (r["n_units"] or {}).get(name) and r["ci_low"].get(name) is None and value is not None:
                note = r["ci_note"][name]
                assert note, (r["task"], name)
                missing += 1
                if r["task"] == "odmap_per_class":
                    cell = f"| {name.replace('_', chr(92) + '_')} | {value:.4f} (no interval: {note}) (n = "
                    assert cell in md, cell
    assert missing >= 4, missing
    # Paired differences too, the per-class family's included: an interval or why not.
    cells = re.findall(r"^\| \S+/.* \| (\S+(?: \[.*?\]| \(no interval: [^)]*\))?) \| \S+ \| \S+ \| \S+ \|$", md, re.M)
    assert len(cells) >= 40 and all("[" in c or "no interval" in c for c in cells), cells


def test_intervals_are_deterministic_and_off_with_bootstrap_zero(report, builds, tiny_models_dir, tmp_path):
    from builders.models.profiles import tiny_profile

    out, _ = report
    common = [
        "benchmark",
        "--model",
        tiny_profile(tiny_models_dir).clip,
        "--counterfactuals",
        str(builds[2]),
        "--blind-lm",
        "none",
        "--cache-dir",
        str(out / "embeddings"),
    ]
    runs = {}
    for name, extra in (
        ("same", ["--seed", "3"]),
        ("again", ["--seed", "3"]),
        ("other", ["--seed", "4"]),
        ("off", ["--bootstrap", "0"]),
    ):
        args = [*common, *(["--bootstrap", "200"] if name != "off" else []), *extra]
        assert cli_main([*args, "--output", str(tmp_path / name)]) == 0
        runs[name] = {r["task"]: r for r in _records(tmp_path / name)}["itm"]
    assert runs["same"]["ci_low"] == runs["again"]["ci_low"]
    assert runs["same"]["ci_low"] != runs["other"]["ci_low"]
    assert runs["same"]["metrics"] == runs["off"]["metrics"]
    assert set(runs["off"]["ci_low"].values()) == {None} and runs["off"]["bootstrap"] == 0


def test_paired_comparisons_mark_ties_and_wins():
    """Two models scoring the same units identically: not tested (the same difference, 0, on every
    unit: #50), said once with why; a model winning on every unit beats the other, and the table
    bolds it."""
    from training.report.compare import compare_dataset, verdicts
    from training.report.markdown import comparison_table
    from training.statistics import UnitScores

    rng = np.random.default_rng(0)
    hits = (rng.random(400) < 0.5).astype(float)
    units = {
        "a": {"zeroshot_retrieval/text_retrieval_recall@1": UnitScores("images", hits)},
        "b": {"zeroshot_retrieval/text_retrieval_recall@1": UnitScores("images", hits.copy())},
        "c": {
            "zeroshot_retrieval/text_retrieval_recall@1": UnitScores("images", np.maximum(hits, rng.random(400) < 0.6))
        },
    }
    name = "text_retrieval_recall@1"
    for pair, best, bold in ((["a", "b"], "a", False), (["a", "c"], "c", True)):
        tests = compare_dataset("coco", {m: units[m] for m in pair}, pair, 500, 0)
        records = [
            {
                "dataset": "coco",
                "task": "zeroshot_retrieval",
                "model": m,
                "metrics": {name: units[m]["zeroshot_retrieval/text_retrieval_recall@1"].value()},
            }
            for m in pair
        ]
        found = verdicts(records, "coco", tests)
        assert found[("zeroshot_retrieval", name)][:2] == (best, bold)
        rows = comparison_table(records, "coco", pair, found)[2:4]
        text = "\n".join(comparison_table(records, "coco", pair, found))
        if bold:
            assert rows[pair.index(best)].count("**") == 2 and "no significant difference" not in text
        else:
            assert "**" not in text and text.count("not tested: all 400 units equal") == 1
        assert tests[0].p_holm == pytest.approx(tests[0].p_value, nan_ok=True)  # one test: Holm changes nothing


def test_report_has_paired_differences_forest_plots_and_floors(report):
    out, texts = report
    md = (out / "report.md").read_text()
    assert "| metric | model | vs | n | difference [95 % CI] | test | p | p (Holm) |" in md
    for dataset in ("coco", "decorrelation", "counterfactuals"):
        assert (out / f"forest-{dataset}.png").stat().st_size > 0 and f"(forest-{dataset}.png)" in md
    assert md.count("| *chance level* |") == 3
    # n on every dataset table and forest plot, the fixture's few units marked, no equivalence
    # wording (#42).
    assert md.count("| *n (units)* |") == 3 and "small sample" in md
    assert "(tie)" not in md and "cannot be told apart" not in md
    assert any(t.startswith("itm/IR_c_mean, n = 6") for t in texts), texts
    records = _records(out)
    queries = {r["n_units"]["ODmAP@1"] for r in records if r["task"] == "odmap"}
    for r in records:
        if r["task"] == "odmap_per_class" or r["task"] == "necessity":
            for name, n in r["n_units"].items():
                if name != "PN_mean":  # a class: its own queries, not the whole set
                    assert 0 < n < max(queries), (name, n)
    assert "Blind text-only baseline" in md and "far from 50 %" in md and "Same-word pairs: 0 of 6" in md
    blind = [r for r in _records(out) if r["task"] == "blind_baseline"]
    assert len(blind) == 2 and {r["backend"] for r in blind} == {"text-only"}
    for r in blind:
        prefer = next(n for n in r["metrics"] if n.endswith("prefers_original"))
        assert r["chance"][prefer] == 0.5 and r["metrics"]["same_word_pairs"] == 0
        assert 0 <= r["metrics"][prefer] <= 1 and r["ci_low"][prefer] is not None
        assert r["n_units"][prefer] == 6 and r["n_units"][f"{prefer}_same_words"] == 0
        assert re.search(rf"{re.escape(prefer.replace('_', chr(92) + '_'))} \| \d\.\d{{4}} \[", md)


def test_chance_levels_equal_their_closed_forms(report, builds):
    from math import comb

    out, _ = report
    coco = {r["task"]: r for r in _records(out) if r["dataset"] == "coco"}
    retrieval = coco["zeroshot_retrieval"]["chance"]
    # 6 test images x 5 captions: a caption finds its image in a random top K with K/6; an
    # image finds one of its 5 captions among 30 with 1 - C(25, K) / C(30, K).
    for k in (1, 5, 10):
        assert retrieval[f"image_retrieval_recall@{k}"] == pytest.approx(min(1, k / 6))
        assert retrieval[f"text_retrieval_recall@{k}"] == pytest.approx(1 - comb(25, k) / comb(30, k))
    assert set(coco["itm"]["chance"].values()) == {0.0, 0.5}
    # ODmAP@1 of a random ranking, in closed form: the exact value an independent audit computed
    # on this fixture (#42), where 20 random rankings printed 0.0800.
    odmap = next(r for r in _records(out) if r["task"] == "odmap")
    assert odmap["chance"]["ODmAP@1"] == pytest.approx(0.0558, abs=5e-5)
    # PN's floor: each model's own, below 0 (not the 0 a model without preference misses).
    floors = [r["chance"]["PN_mean"] for r in _records(out) if r["task"] == "necessity"]
    assert len(floors) == 2 and all(f < 0 for f in floors)
    assert coco["itm"]["chance"]["IR_r_frac_below_zero"] == 0.5


def test_same_word_pairs_are_counted_apart():
    from training.report.floors import same_words

    assert same_words("A dog chases a cat.", "a cat chases a dog")
    assert not same_words("A dog chases a cat.", "A dog chases a bird.")


def test_the_random_pairs_are_a_seeded_derangement():
    from counterfactory_metrics.itm_score_deltas.deltas import random_derangement

    perm = random_derangement(1000, 0)
    assert sorted(perm.tolist()) == list(range(1000)) and not (perm == np.arange(1000)).any()
    assert (random_derangement(1000, 0) == perm).all() and not (random_derangement(1000, 1) == perm).all()
    # Not the fixed "next row" stand-in: the partners are spread over the set.
    assert np.mean(perm == np.roll(np.arange(1000), -1)) < 0.01


def test_real_pair_deltas_use_the_derangement(report):
    out, _ = report
    itm = next(r for r in _records(out) if r["dataset"] == "coco" and r["task"] == "itm")
    assert itm["pair_seed"] == 0


def test_no_figure_or_file_of_the_report_names_a_local_path(report, tiny_models_dir, builds):
    out, texts = report
    forbidden = [str(tiny_models_dir), str(Path(tiny_models_dir).resolve()), str(builds[0].parent), "local-dir:/"]
    assert texts, "no figure text captured"
    assert not [t for t in texts if any(f in t for f in forbidden)]
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".md", ".jsonl", ".json"):
            text = path.read_text()
            assert not [f for f in forbidden if f in text], path
    assert any(t.startswith("ITM score deltas on") and "local:clip@sha256:" in t for t in texts)


def test_code_and_metric_versions_are_exact(report):
    from builders.engine.provenance import code_version, source_digest

    out, _ = report
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2]
    ).stdout.strip()
    assert re.fullmatch(rf"git:{head}(\+dirty)?", code_version())
    for r in _records(out):
        assert r["code_version"] == code_version()
        assert r["metric_version"] == source_digest(r["metric"]) and r["metric_version"].startswith("sha256:")


def test_a_wheel_install_is_versioned_by_its_files(tmp_path, monkeypatch):
    """Outside a git checkout of the package (a wheel, also inside someone else's work tree):
    the version and a digest of the installed files, which an edit changes."""
    import sys

    from builders.engine import provenance

    outer = tmp_path / "outer"
    package = outer / "site" / "pkg_under_test"
    package.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(outer),
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "someone else's tree",
        ],
        check=True,
    )
    assert provenance.git_state(outer / "site")["commit"] is None  # not the enclosing tree's commit
    (package / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(outer / "site"))
    first = provenance.source_digest("pkg_under_test")
    provenance.source_digest.cache_clear()
    (package / "__init__.py").write_text("X = 2\n")
    assert provenance.source_digest("pkg_under_test") != first
    provenance.code_version.cache_clear()
    monkeypatch.setattr(provenance, "git_state", lambda root=None: {"commit": None, "dirty": None})
    try:
        assert re.fullmatch(r"0\.1\.0\+sha256:[0-9a-f]{16}", provenance.code_version())
    finally:
        provenance.code_version.cache_clear()
        sys.modules.pop("pkg_under_test", None)


def test_a_metric_module_change_misses_the_cache(report, builds, tiny_models_dir, tmp_path, monkeypatch):
    """The embedding cache key holds each evaluation module's file digest: a fix in one (here
    its digest changed) scores the model again instead of reusing the old numbers."""
    import training.evaluation
    import training.report.cache as cache
    from builders.models.profiles import tiny_profile

    out, _ = report
    shutil.copytree(out / "embeddings", tmp_path / "cache")
    encoded = []
    encode = training.evaluation.compute_embeddings
    monkeypatch.setattr(
        training.evaluation, "compute_embeddings", lambda *a, **kw: encoded.append(1) or encode(*a, **kw)
    )
    args = [
        "benchmark",
        "--model",
        tiny_profile(tiny_models_dir).clip,
        "--counterfactuals",
        str(builds[2]),
        "--blind-lm",
        "none",
        "--bootstrap",
        "0",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert cli_main([*args, "--output", str(tmp_path / "hit")]) == 0
    assert encoded == []
    digest = cache.source_digest
    monkeypatch.setattr(
        cache, "source_digest", lambda m: "sha256:fixed" if m.endswith("itm_score_deltas") else digest(m)
    )
    assert cli_main([*args, "--output", str(tmp_path / "miss")]) == 0
    assert encoded == [1]


def test_records_and_a_clip_benchmark_result_load_into_one_table(report, tmp_path):
    """clip-benchmark writes one JSON per run (`dataset`, `model`, `pretrained`, `task`,
    `metrics`, `language`): ours concatenate with it, metric for metric."""
    import pandas as pd

    out, _ = report
    theirs = {
        "dataset": "mscoco_captions",
        "model": "ViT-B-32",
        "pretrained": "openai",
        "task": "zeroshot_retrieval",
        "metrics": {"image_retrieval_recall@5": 0.547, "text_retrieval_recall@5": 0.749},
        "language": "en",
    }
    (tmp_path / "clip_benchmark.json").write_text(json.dumps(theirs))
    rows = [json.loads((tmp_path / "clip_benchmark.json").read_text()), *_records(out)]
    table = pd.json_normalize(rows)
    retrieval = table[table["task"] == "zeroshot_retrieval"]
    assert len(retrieval) == 3 and retrieval["language"].eq("en").all()
    for column in ("metrics.image_retrieval_recall@5", "metrics.text_retrieval_recall@5"):
        assert retrieval[column].notna().all()
    assert retrieval["pretrained"].notna().all()


def test_baseline_compares_every_model_with_it(report, builds, tiny_models_dir, tmp_path):
    from builders.engine.provenance import model_name
    from builders.models.profiles import tiny_profile

    out, _ = report
    profile = tiny_profile(tiny_models_dir)
    assert (
        cli_main(
            [
                "benchmark",
                "--model",
                profile.open_clip,
                "--baseline",
                profile.clip,
                "--counterfactuals",
                str(builds[2]),
                "--blind-lm",
                "none",
                "--bootstrap",
                "200",
                "--cache-dir",
                str(out / "embeddings"),
                "--output",
                str(tmp_path / "b"),
            ]
        )
        == 0
    )
    md = (tmp_path / "b" / "report.md").read_text()
    from training.report.markdown import plain

    assert f"Paired differences against the baseline {plain(model_name(profile.clip))}" in md
    rows = [line for line in md.splitlines() if line.startswith("| itm/")]
    assert rows and all(f"| {plain(model_name(profile.clip))} |" in row.split("] |")[0] for row in rows)


def _break(kind: str, build: Path, tmp: Path) -> tuple[Path, str]:
    """A copy of `build` with a bad shard or image; the copy and the shard's file name."""
    copy = tmp / kind
    shutil.copytree(build, copy)
    shard = next((copy / "data").glob("test-*.parquet"))
    data = shard.read_bytes()
    if kind == "truncated":
        shard.write_bytes(data[: len(data) // 2])
    elif kind == "corrupted":  # the footer's metadata overwritten, the size unchanged
        shard.write_bytes(data[:-300] + bytes(range(256))[:292] + data[-8:])
    else:
        from datasets import Dataset

        table = Dataset.from_parquet(str(shard))
        rows = table.to_dict()
        rows["image_1"][2] = {"bytes": b"not an image", "path": None}
        Dataset.from_dict(rows, features=table.features).to_parquet(str(shard))
    return copy, shard.name


@pytest.mark.parametrize("kind", ["truncated", "corrupted", "undecodable"])
def test_a_bad_shard_or_image_is_one_line_naming_the_file(kind, builds, tiny_models_dir, tmp_path, capsys):
    from builders.models.profiles import tiny_profile

    flag, build = ("--counterfactuals", builds[2]) if kind == "undecodable" else ("--coco", builds[0])
    broken, shard = _break(kind, build, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("mine")
    capsys.readouterr()
    assert (
        cli_main(
            [
                "benchmark",
                "--model",
                tiny_profile(tiny_models_dir).clip,
                flag,
                str(broken),
                "--blind-lm",
                "none",
                "--output",
                str(out),
            ]
        )
        == 2
    )
    line = error_line(capsys)
    assert flag in line and shard in line, line
    if kind == "undecodable":
        assert "row 2" in line and "image_1" in line, line
    assert (out / "kept.txt").read_text() == "mine" and not (out / "results.jsonl").exists()


def test_a_folder_that_is_no_model_is_one_whole_sentence(builds, tmp_path, capsys):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    assert (
        cli_main(["benchmark", "--model", str(folder), "--coco", str(builds[0]), "--output", str(tmp_path / "out")])
        == 2
    )
    line = error_line(capsys)
    assert f"--model {folder}" in line and line.endswith("or open_clip:ARCH:TAG")
    assert "or use )" not in line and line.count("(") == line.count(")"), line


def test_columns_in_natural_order_and_all_zero_charts_say_so(tmp_path, monkeypatch):
    from counterfactory_metrics.odmap.odmap_scores import plot_per_class
    from training.report.markdown import comparison_table

    records = [{"dataset": "d", "task": "t", "model": "m", "metrics": {"R@1": 0.5, "R@10": -0.00001, "R@5": 0.25}}]
    header, _, row = comparison_table(records, "d", ["m"])
    assert header == "| model | t/R@1 | t/R@5 | t/R@10 |" and "-0.0000" not in row
    texts = FigureTexts(monkeypatch)
    plot_per_class({"dog": {1: 0.0, 5: 0.0}, "cat": {1: 0.0, 5: 0.0}}, tmp_path / "zero.png")
    assert any("0 for every class" in t for t in texts.texts)


def test_rows_pushed_before_the_intervals_still_load(report, repo_id):
    """A results repo holding a file of the columns an older version wrote (no intervals): a
    push of new records succeeds, the old rows keep their values with null intervals, and
    `load_dataset` reads every row under one schema."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import load_dataset
    from huggingface_hub import CommitOperationAdd, HfApi

    from training.report.hub_results import OLD_COLUMNS, push_results

    out, _ = report
    records = [r for r in _records(out) if r["task"] != "blind_baseline"]
    old = []
    for r in records[:3]:  # as the previous version's to_row wrote them
        row = {c: r.get(c) for c in OLD_COLUMNS}
        row.update(
            metrics=json.dumps(r["metrics"], sort_keys=True),
            metric_version="0.1.0",
            code_version="0.1.0",
            key=json.dumps([r["model"], "old", r["task"]]),
        )
        old.append(row)
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(old, schema=pa.schema([(c, pa.string()) for c in OLD_COLUMNS])), buf)
    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset", exist_ok=True)
    api.create_commit(
        repo_id,
        repo_type="dataset",
        commit_message="rows of an older version",
        operations=[CommitOperationAdd("data/results-old.parquet", buf.getvalue())],
    )
    assert push_results(records, repo_id) == len(records)
    rows = load_dataset(repo_id, split="train", download_mode="force_redownload")
    assert len(rows) == len(records) + len(old)
    by_key = {r["key"]: r for r in rows}
    for row in old:
        loaded = by_key[row["key"]]
        assert json.loads(loaded["metrics"]) == json.loads(row["metrics"]) and loaded["ci_low"] is None
    assert sum(r["ci_low"] is not None for r in rows) == len(records)
