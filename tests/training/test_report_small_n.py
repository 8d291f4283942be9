"""`counterfactory benchmark` at fixture sizes (#42): every record carries its units and clusters
and how its interval was made; a proportion of 0 or 1 gets its exact binomial interval, not a
point; a metric fixed by construction says so; counterfactual pairs and decorrelation queries of
one source image are one cluster; sign-flip p-values at n <= log2(B) clusters do not depend on the seed;
and `--bootstrap` beyond the memory budget is one line before any model loads (#41 §3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import load_dataset
from scipy import stats

from builders.app.cli import main as cli_main
from helpers.build_helpers import error_line
from helpers.training_helpers import report_builds, write_counterfactuals

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: Source image of each counterfactual pair: 6 pairs from 3 COCO images.
SOURCES = [11, 11, 11, 22, 33, 33]


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    root = tmp_path_factory.mktemp("builds")
    cc, dec, _ = report_builds(root, coco_fixture_dir)
    return cc, dec, write_counterfactuals(root / "cf-clustered", SOURCES)


def _run(builds, tiny_models_dir, out: Path, seed: int) -> Path:
    from builders.models.profiles import tiny_profile

    profile = tiny_profile(tiny_models_dir)
    cc, dec, cf = builds
    argv = ["benchmark", "--model", profile.clip, "--model", profile.open_clip, "--blind-lm", "none"]
    argv += ["--coco", str(cc), "--decorrelation", str(dec), "--counterfactuals", str(cf)]
    assert cli_main([*argv, "--bootstrap", "1000", "--seed", str(seed), "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def reports(builds, tiny_models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    return [_run(builds, tiny_models_dir, root / f"seed{seed}", seed) for seed in (0, 7)]


def _records(out: Path) -> list[dict]:
    from training.report.results import read_results

    return read_results(out / "results.jsonl")


def test_records_carry_units_clusters_and_the_interval_method(reports, builds):
    records = _records(reports[0])
    queries = load_dataset(str(builds[1]), "odmap_queries", split="test")["image_id"]
    for r in records:
        for name, value in r["metrics"].items():
            if r["n_units"].get(name) is None:
                continue
            assert r["ci_method"][name] in {"clopper-pearson", "studentized", "dyadic-t", "percentile", "none"}, (
                r["task"],
                name,
            )
            assert 0 < r["n_clusters"][name] <= r["n_units"][name]
            if r["ci_low"][name] is not None and not r["trivial"][name]:
                assert r["ci_low"][name] < r["ci_high"][name], (r["task"], name)  # no point interval
    itm = next(r for r in records if r["dataset"] == "counterfactuals" and r["task"] == "itm")
    assert (itm["n_units"]["IR_c_mean"], itm["n_clusters"]["IR_c_mean"]) == (6, 3)
    assert itm["ci_method"]["IR_c_frac_below_zero"] == "clopper-pearson"
    # 3 source images are too few for a bootstrap (#42: TR_c_mean printed [0.0002, 1905521.4843]);
    # the 6 real pairs (COCO images) are 6 units, enough.
    for name in ("IR_c_mean", "IR_c_median", "TR_c_mean", "TR_c_median"):
        assert itm["ci_method"][name] == "none" and itm["ci_low"][name] is None, name
        assert itm["ci_note"][name] == "fewer than 6 clusters", name
    real = next(r for r in records if r["dataset"] == "coco" and r["task"] == "itm")
    # The real pairs' mean: a t interval on their dyadic se (statistics.dyadic_t).
    assert real["n_clusters"]["IR_r_mean"] == 6 and real["ci_method"]["IR_r_mean"] == "dyadic-t"
    assert real["ci_method"]["IR_r_median"] == "percentile"
    odmap = next(r for r in records if r["task"] == "odmap")
    for name in odmap["metrics"]:
        assert odmap["n_units"][name] == len(queries)
        assert odmap["n_clusters"][name] == len(set(queries)) < len(queries)


def test_a_proportion_gets_its_exact_binomial_interval_and_a_fixed_one_says_so(reports):
    retrieval = [r for r in _records(reports[0]) if r["task"] == "zeroshot_retrieval"]
    assert retrieval
    for r in retrieval:
        for name, value in r["metrics"].items():
            n = r["n_units"][name]
            if r["trivial"][name]:  # K >= the gallery: every ranking is a hit
                assert value == 1.0 and r["ci_low"][name] is None and r["ci_method"][name] == "none"
                assert r["ci_note"][name] == "fixed by construction"
                continue
            assert r["ci_method"][name] == "clopper-pearson"
            if name.startswith("text_retrieval"):  # i2t: one trial an image, a plain binomial
                ci = stats.binomtest(round(value * n), n).proportion_ci(method="exact")
                assert (r["ci_low"][name], r["ci_high"][name]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    n_images = retrieval[0]["n_units"]["image_retrieval_recall@1"]
    trivial = {name for r in retrieval for name, t in r["trivial"].items() if t}
    assert trivial == {f"image_retrieval_recall@{k}" for k in (1, 5, 10) if k >= n_images}
    # report.md's coco table says why those have no interval, in every model's cell.
    from training.report.markdown import plain

    table = [line for line in _section((reports[0] / "report.md").read_text(), "### coco ") if line.startswith("| ")]
    columns = [c.strip() for c in table[0].split("|")[1:-1]]
    for name in trivial:
        at = columns.index(plain(f"zeroshot_retrieval/{name}"))
        cells = [row.split("|")[1:-1][at].strip() for row in table[1:3]]
        assert all(c == "1.0000 (no interval: fixed by construction)" for c in cells), cells


def _pvalues(out: Path) -> dict[str, tuple[str, str]]:
    """The ITM rows of report.md's paired comparisons (two models: one row a metric): metric ->
    (test, p-value)."""
    rows = [line.split("|") for line in (out / "report.md").read_text().splitlines() if line.startswith("| itm/")]
    return {row[1].strip().replace("\\_", "_"): (row[-4].strip(), row[-3].strip()) for row in rows}


def test_pvalues_on_few_clusters_are_exact_and_seed_independent(reports):
    """3 source images (IR_c, TR_c): below 6 clusters no p-value could reach 0.05, so there is
    none (n/a, #50). 6 real pairs (IR_r, TR_r): a median's sign-flip test enumerates the 2^6 <=
    1,000 swap patterns, so seeds 0 and 7 agree and its p-value is a multiple of 1/64 (printed to
    4 digits), not a random (k + 1) / 1,001; a mean's of real pairs is the dyadic-t test's and
    a fraction's the Newcombe interval's (#50 round 3), each the dual of its interval."""
    first, second = (_pvalues(out) for out in reports)
    assert first and first.keys() == second.keys()
    for metric, (test, p) in first.items():
        if "_c_" in metric:
            assert (test, p) == ("none", "n/a") == second[metric], metric
        elif metric.endswith("median"):
            assert test == "sign-flip" and second[metric] == (test, p), metric
            assert 64 * float(p) == pytest.approx(round(64 * float(p)), abs=0.01), metric
        else:
            expected = "newcombe" if metric.endswith("frac_below_zero") else "dyadic-t"
            assert test == expected and second[metric] == (test, p) and 0 < float(p) <= 1, metric


def test_bootstrap_beyond_the_memory_budget_is_one_line_before_any_model(builds, tmp_path, capsys):
    capsys.readouterr()
    argv = ["benchmark", "--model", str(tmp_path / "no-such-model"), "--counterfactuals", str(builds[2])]
    assert cli_main([*argv, "--bootstrap", "1000000000", "--output", str(tmp_path / "out")]) == 2
    line = error_line(capsys)
    assert "--bootstrap 1000000000" in line and "1,000,000" in line and "no-such-model" not in line, line
    assert not (tmp_path / "out").exists()


def _section(markdown: str, heading: str) -> list[str]:
    """The lines of the section whose heading line starts with `heading` (up to the next one)."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def test_paired_differences_count_clusters_where_they_differ_from_units(reports):
    """The counterfactual pairs come from 3 source images (6 pairs): the paired-differences
    table's n says so, as the dataset table's `n (units)` row does, and every difference and
    value on them says why it has no interval (too few clusters for a bootstrap, #42)."""
    section = _section((reports[0] / "report.md").read_text(), "### counterfactuals ")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in section if line.startswith("| itm/IR\\_c\\_")]
    assert rows
    clustered = f"{len(SOURCES)} in {len(set(SOURCES))} clusters"
    for metric, _, _, n, difference, *_ in rows:
        assert n.startswith(clustered) and "small sample" in n, (metric, n)
        assert difference.endswith("(no interval: fewer than 6 clusters)"), (metric, difference)
    # The dataset table says it in every model's cell of a 3-cluster mean.
    table = [
        line for line in section if line.startswith("| local:") and "(no interval: fewer than 6 clusters)" in line
    ]
    assert len(table) == 2, section


#: The columns of the results files pushed before the records' clusters, interval methods and
#: chance levels (#42), as that version wrote them.
PREVIOUS_COLUMNS = (
    *("dataset", "model", "pretrained", "backend", "weights_digest", "task", "metrics", "language"),
    *("ci_low", "ci_high", "n_units", "bootstrap", "seed", "dataset_source", "dataset_revision"),
    *("dataset_commit", "metric", "metric_version", "code_version", "key"),
)


def _previous_rows(records: list[dict]) -> list[dict]:
    import json

    rows = []
    for r in records:
        row = {c: r.get(c) for c in PREVIOUS_COLUMNS}
        for c in ("metrics", "ci_low", "ci_high", "n_units", "bootstrap", "seed"):
            row[c] = json.dumps(r[c], sort_keys=True)
        row.update(code_version="previous", key=json.dumps([r["model"], r["dataset"], r["task"], "previous"]))
        rows.append(row)
    return rows


def test_push_after_a_file_of_the_previous_schema_keeps_one_schema(
    reports, builds, tiny_models_dir, repo_id, tmp_path
):
    """A results repo holding a file of the previous columns (no clusters, methods, notes or
    chance levels): `benchmark --push-to-hub` adds its rows with those columns, rewrites the old
    file with them (its values unchanged, the new columns null), `load_dataset` reads one schema,
    and the card's n row counts the source images."""
    import io
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from huggingface_hub import CommitOperationAdd, HfApi

    from builders.models.profiles import tiny_profile

    old = _previous_rows([r for r in _records(reports[0]) if r["dataset"] == "coco"][:3])
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(old, schema=pa.schema([(c, pa.string()) for c in PREVIOUS_COLUMNS])), buf)
    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset")
    api.create_commit(
        repo_id,
        repo_type="dataset",
        commit_message="rows of the previous version",
        operations=[CommitOperationAdd("data/results-previous.parquet", buf.getvalue())],
    )
    profile = tiny_profile(tiny_models_dir)
    argv = ["benchmark", "--model", profile.clip, "--model", profile.open_clip, "--blind-lm", "none"]
    argv += ["--counterfactuals", str(builds[2]), "--cache-dir", str(reports[0] / "embeddings")]
    out = tmp_path / "out"
    assert cli_main([*argv, "--bootstrap", "1000", "--push-to-hub", repo_id, "--output", str(out)]) == 0

    rows = load_dataset(repo_id, split="train", download_mode="force_redownload")
    new_columns = {"n_clusters", "ci_method", "trivial", "ci_note", "chance"}
    assert new_columns <= set(rows.column_names)
    files = [f for f in api.list_repo_files(repo_id, repo_type="dataset") if f.startswith("data/")]
    schemas = {tuple(pq.read_schema(api.hf_hub_download(repo_id, f, repo_type="dataset")).names) for f in files}
    assert len(files) == 2 and len(schemas) == 1
    by_key = {r["key"]: r for r in rows}
    for row in old:
        loaded = by_key[row["key"]]
        assert {c: loaded[c] for c in PREVIOUS_COLUMNS} == row
        assert all(loaded[c] is None for c in new_columns)
    records = _records(out)
    itm = next(r for r in rows if r["task"] == "itm" and r["key"] not in {o["key"] for o in old})
    assert json.loads(itm["n_clusters"])["IR_c_mean"] == len(set(SOURCES))
    assert json.loads(itm["n_units"])["IR_c_mean"] == len(SOURCES)
    mine = next(r for r in records if r["task"] == "itm" and r["model"] == itm["model"])
    for column in new_columns:
        assert json.loads(itm[column]) == mine[column], column
    card = Path(api.hf_hub_download(repo_id, "README.md", repo_type="dataset")).read_text()
    n_row = next(line for line in _section(card, "## counterfactuals") if "n (units)" in line)
    assert f"{len(SOURCES)} in {len(set(SOURCES))} clusters" in n_row


def test_a_fixed_metric_is_neither_tested_nor_in_the_holm_family(reports):
    """The fixture's image R@K with K at least its gallery (every ranking is a hit) is fixed by
    construction: its paired rows have no test and no p-value, its column says so, and the Holm
    family is the tested rows alone (on main they were tested, p = 1, and counted, #50)."""
    section = _section((reports[0] / "report.md").read_text(), "### coco ")
    start = section.index("| metric | model | vs | n | difference [95 % CI] | test | p | p (Holm) |") + 2
    end = next((i for i in range(start, len(section)) if not section[i].startswith("| ")), len(section))
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in section[start:end]]  # the coco family
    fixed = [r for r in rows if r[4].endswith("(no interval: fixed by construction)")]
    assert fixed and all(r[5:] == ["none", "n/a", "n/a"] for r in fixed), fixed
    tested = [(float(r[6]), float(r[7])) for r in rows if r[6] != "n/a"]
    assert tested and len(tested) + len(fixed) <= len(rows)
    smallest = min(tested)
    assert smallest[1] == pytest.approx(min(1.0, len(tested) * smallest[0]), rel=1e-3)
    verdict = next(line for line in section if line.startswith("| *best vs runner-up*"))
    assert "not tested: fixed by construction" in verdict
