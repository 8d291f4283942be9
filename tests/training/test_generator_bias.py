"""`counterfactory benchmark --counterfactuals RENDERINGS` (issue #37 §2): a caption-pair table
rendered by several generators, one config each, is scored per generator exactly as a build of
that generator's rows alone, and the generator-bias table pairs the generators on the pairs every
one of them kept: its differences against numpy on the per-pair scores (its 3 common pairs: no
interval, no test), a planted generator with the same images as another at difference 0, a
dropped pair left out of every difference.

The fixture (`helpers/renderings_helpers.py`): tiny sd15 and sdxl builds of one 4-pair table; the
sdxl config without pair "9" (dropped by that generator), a planted `sd3` config holding
sd15's rows (the same images), and the shared caption-pair table (config `captions`, not scored)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from builders.app.cli import main as cli_main
from helpers.build_helpers import error_line
from helpers.renderings_helpers import (
    as_generator,
    caption_table,
    generator_build,
    plain_build,
    split_rows,
    without_ids,
    write_renderings,
)

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

PAIRS = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach."),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch."),
    ("B3", "A red car parked on the street.", "A blue car parked on the street."),
    ("C4", "A small bird on a branch.", "A small cat on a branch."),
]
DROPPED = "9"  # by sdxl
GENERATORS = ("sd15", "sdxl", "sd3")
RESAMPLES, SEED = 1000, 3


@pytest.fixture(scope="module")
def fixture(tmp_path_factory, tiny_models_dir, nltk_data_dir):
    root = tmp_path_factory.mktemp("renderings")
    sd15 = split_rows(generator_build(root / "sd15", tiny_models_dir, "sd15", PAIRS))
    sdxl = split_rows(generator_build(root / "sdxl", tiny_models_dir, "sdxl", PAIRS))
    assert (
        sorted(sd15.column("id").to_pylist()) == sorted(sdxl.column("id").to_pylist()) == sorted(p[0] for p in PAIRS)
    )
    tables = {"sd15": sd15, "sdxl": without_ids(sdxl, {DROPPED}), "sd3": as_generator(sd15, "sd3")}
    return {
        "renderings": write_renderings(root / "renderings", tables, caption_table(PAIRS)),
        "tables": tables,
        "plain": {g: plain_build(root / f"plain-{g}", t) for g, t in tables.items()},
    }


def benchmark(out: Path, counterfactuals: Path | str, tiny: Path, *extra: str) -> list[dict]:
    from training.report.results import read_results

    args = ["benchmark", "--models", "tiny", "--tiny-models-dir", str(tiny), "--counterfactuals", str(counterfactuals)]
    args += ["--bootstrap", str(RESAMPLES), "--seed", str(SEED), "--output", str(out), *extra]
    assert cli_main(args) == 0
    return read_results(out / "results.jsonl")


@pytest.fixture(scope="module")
def report(fixture, tiny_models_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    return out, benchmark(out, fixture["renderings"], tiny_models_dir)


def _bias(records: list[dict]) -> dict[tuple[str, str, str], dict]:
    return {(r["model"], r["generator"], r["other_generator"]): r for r in records if r["task"] == "generator_bias"}


# -- per generator ------------------------------------------------------------------------------


def test_each_generator_is_scored_as_a_build_of_its_rows_alone(report, fixture, tiny_models_dir, tmp_path):
    """Every generator's records (dataset `counterfactuals/G`, `generator` G) hold the numbers a
    benchmark of a single-config folder of G's rows gives: metrics, intervals, units, chance levels
    and the blind text-only baseline."""
    out, records = report
    per_generator = [r for r in records if r["task"] != "generator_bias"]
    assert {r["dataset"] for r in per_generator} == {f"counterfactuals/{g}" for g in GENERATORS}
    for r in per_generator:
        assert r["generator"] == r["dataset"].removeprefix("counterfactuals/")
    models = {r["model"] for r in per_generator if r["task"] == "itm"}
    assert len(models) == 2
    for g in ("sdxl", "sd15"):
        alone = benchmark(tmp_path / g, fixture["plain"][g], tiny_models_dir)
        assert {r["dataset"] for r in alone} == {"counterfactuals"} and "generator" not in alone[0]
        mine = {(r["model"], r["task"]): r for r in per_generator if r["generator"] == g}
        theirs = {(r["model"], r["task"]): r for r in alone}
        assert mine.keys() == theirs.keys() and {t for _, t in mine} == {"itm", "blind_baseline"}
        for key, r in theirs.items():
            for field in ("metrics", "ci_low", "ci_high", "n_units", "chance", "weights_digest"):
                assert mine[key][field] == r[field], (g, key, field)
        assert {mine[(m, "itm")]["n_units"]["IR_c_mean"] for m in models} == {len(fixture["tables"][g])}


def test_report_has_a_section_and_plots_per_generator_and_the_per_generator_table(report):
    out, records = report
    md = (out / "report.md").read_text()
    for g in GENERATORS:
        assert f"### counterfactuals/{g} (" in md
        assert (out / f"forest-counterfactuals-{g}.png").is_file()
        for n in (0, 1):
            assert (out / f"itm_deltas-model{n}-counterfactuals-{g}.png").is_file()
            assert f"(itm_deltas-model{n}-counterfactuals-{g}.png)" in md
    table = md.split("## Per generator", 1)[1].split("## Generator bias", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert header.startswith("| model | generator | pairs | itm/IR\\_c\\_frac\\_below\\_zero |")
    itm = {(r["model"], r["generator"]): r for r in records if r["task"] == "itm"}
    assert len(body) == len(itm) + 1 and body[-1].startswith("| *chance level* | | | 0.5000 |")
    for line in body[:-1]:
        model, generator, pairs, first = (c.strip() for c in line.strip("|").split("|")[:4])
        r = itm[(model.replace("\\", ""), generator)]
        ci = f"{r['metrics']['IR_c_frac_below_zero']:.4f} [{r['ci_low']['IR_c_frac_below_zero']:.4f}, "
        assert first.startswith(ci) and int(pairs) == r["n_units"]["IR_c_mean"]


# -- the generator-bias table -----------------------------------------------------------------------


def _ids(table) -> list[str]:
    return table.column("id").to_pylist()


def _deltas(out: Path, record: dict, generator: str) -> dict[str, np.ndarray]:
    """IR_c and TR_c per pair of `generator`'s rows, from the per-pair ITM scores the benchmark
    cached for the record's model (G(C_c, I_c^s) - G(C_c, I_o^s), G(C_c, I_c^s) - G(C_o, I_c^s))."""
    digest = record["weights_digest"]
    for meta in (out / "embeddings").glob("*.json"):
        key = json.loads(meta.read_text())["key"]
        if key["weights_digest"] == digest and key["tables"][0][2] == generator:
            with np.load(meta.with_suffix(".npz")) as z:
                return {
                    "IR_c": z["itm_g_cc_ics"] - z["itm_g_cc_ios"],
                    "TR_c": z["itm_g_cc_ics"] - z["itm_g_co_ics"],
                }
    raise AssertionError(f"no cached embeddings of {record['model']} on {generator}")


STATISTICS = {
    "mean": np.mean,
    "median": np.median,
    "frac_below_zero": lambda d: np.mean(d < 0),
}


def test_paired_differences_match_numpy_on_the_common_pairs(report, fixture):
    """value(G) - value(H) on the pairs every generator kept, for every model, ITM metric and
    two generators G before H; on its 3 pairs (fewer than 6 clusters) no interval and no test:
    no p-value there could reach 0.05 (#50; the Holm family over the whole table:
    test_generator_bias_is_one_holm_family)."""
    out, records = report
    tables = fixture["tables"]
    common = [p for p in _ids(tables["sd15"]) if all(p in _ids(t) for t in tables.values())]
    assert DROPPED not in common and len(common) == 3
    itm = {(r["model"], r["generator"]): r for r in records if r["task"] == "itm"}
    bias = _bias(records)
    models = {m for m, _ in itm}
    assert bias.keys() == {(m, g, h) for m in models for g, h in itertools.combinations(GENERATORS, 2)}
    for (model, g, h), r in bias.items():
        deltas = {x: _deltas(out, itm[(model, x)], x) for x in (g, h)}
        rows = {x: [_ids(tables[x]).index(p) for p in common] for x in (g, h)}
        assert set(r["metrics"]) == {f"{d}_{s}" for d in ("IR_c", "TR_c") for s in STATISTICS}
        for name, value in r["metrics"].items():
            delta, _, stat = name.partition("_c_")
            a, b = (deltas[x][f"{delta}_c"][rows[x]] for x in (g, h))
            expected = STATISTICS[stat](a) - STATISTICS[stat](b)
            assert value == pytest.approx(expected, abs=1e-6), (model, g, h, name)
            # 3 common pairs: too few clusters for a bootstrap interval (statistics.MIN_CLUSTERS).
            assert r["ci_low"][name] is None and r["ci_high"][name] is None
            assert r["p_value"][name] is None and r["p_holm"][name] is None
            assert r["n_units"][name] == len(common)
        assert r["pairs_kept"] == {"sd15": 4, "sdxl": 3, "sd3": 4}
        assert r["pairs_dropped"] == {"sd15": 0, "sdxl": 1, "sd3": 0}
        assert r["dataset"] == "counterfactuals" and r["metric"] == "training.statistics"


def test_a_generator_with_the_same_images_differs_by_zero_untested(report):
    out, records = report
    for (model, g, h), r in _bias(records).items():
        if (g, h) != ("sd15", "sd3"):
            continue
        for name in r["metrics"]:
            assert (r["metrics"][name], r["ci_low"][name], r["ci_high"][name]) == (0.0, None, None), name
            assert r["p_value"][name] is None and r["p_holm"][name] is None
    md = (out / "report.md").read_text()
    section = md.split("## Generator bias", 1)[1].split("## Per model", 1)[0]
    assert "On the 3 pairs every generator kept" in section
    assert "sd15 0, sdxl 1, sd3 0" in section
    lines = [ln for ln in section.splitlines() if "| sd15 | sd3 |" in ln]
    cells = "| 0.0000 (no interval: all 3 units equal) | none | n/a | n/a |"
    assert len(lines) == 2 * 6 and all(cells in ln for ln in lines)


def test_a_pair_one_generator_dropped_is_left_out_of_every_difference(report, fixture):
    """sd15 and sd3 both kept pair "9", sdxl did not: no difference reads it, also not sd15's
    against sdxl's means on their own pairs (what a difference of the per-generator rows would be)."""
    out, records = report
    itm = {(r["model"], r["generator"]): r for r in records if r["task"] == "itm"}
    for (model, g, h), r in _bias(records).items():
        assert set(r["n_units"].values()) == {3}
        if (g, h) == ("sd15", "sdxl"):
            unpaired = itm[(model, g)]["metrics"]["IR_c_mean"] - itm[(model, h)]["metrics"]["IR_c_mean"]
            assert r["metrics"]["IR_c_mean"] != pytest.approx(unpaired, abs=1e-6)
            sd15 = _deltas(out, itm[(model, g)], g)["IR_c"]
            dropped = sd15[_ids(fixture["tables"]["sd15"]).index(DROPPED)]
            # Read: sd15's mean on the common pairs, not on its 4.
            common = (4 * itm[(model, g)]["metrics"]["IR_c_mean"] - dropped) / 3
            sdxl_mean = itm[(model, h)]["metrics"]["IR_c_mean"]
            assert r["metrics"]["IR_c_mean"] == pytest.approx(common - sdxl_mean, abs=1e-6)


# -- fewer than two generators, no common pair, bad input -------------------------------------------


def test_one_generator_or_no_common_pair_is_one_line(fixture, tiny_models_dir, tmp_path):
    tables = fixture["tables"]
    one = write_renderings(tmp_path / "one", {"sdxl": tables["sdxl"]})
    disjoint = write_renderings(
        tmp_path / "disjoint",
        {"sd15": without_ids(tables["sd15"], {"A17", "B3"}), "sdxl": without_ids(tables["sdxl"], {"C4"})},
    )
    for folder, line in (
        (one, "One generator (sdxl 3 pairs): no generator to compare it with."),
        (disjoint, "No pair was kept by every generator (pairs kept: sd15 2, sdxl 2): no paired differences."),
    ):
        out = tmp_path / f"out-{folder.name}"
        records = benchmark(out, folder, tiny_models_dir, "--blind-lm", "none")
        assert not [r for r in records if r["task"] == "generator_bias"]
        configs = ["sdxl"] if folder == one else ["sd15", "sdxl"]
        assert {r["dataset"] for r in records} == {f"counterfactuals/{g}" for g in configs}
        section = (out / "report.md").read_text().split("## Generator bias", 1)[1].split("## Per model", 1)[0]
        assert section.strip() == line


def test_without_resamples_the_table_has_the_differences_alone(report, fixture, tiny_models_dir, tmp_path):
    """`--bootstrap 0`: the same differences, no interval and no p-value (null in the records,
    `n/a` in the report)."""
    from builders.engine.provenance import model_name
    from builders.models.profiles import tiny_profile
    from training.report.results import read_results

    _, records = report
    clip = tiny_profile(tiny_models_dir).clip
    args = ["benchmark", "--model", clip, "--blind-lm", "none", "--bootstrap", "0", "--output", str(tmp_path / "out")]
    assert cli_main([*args, "--counterfactuals", str(fixture["renderings"])]) == 0
    bias = _bias(read_results(tmp_path / "out" / "results.jsonl"))
    assert bias.keys() == {key for key in _bias(records) if key[0] == model_name(clip)}
    for key, r in bias.items():
        assert r["metrics"] == pytest.approx(_bias(records)[key]["metrics"], abs=1e-12)
        for field in ("ci_low", "ci_high", "p_value", "p_holm"):
            assert set(r[field].values()) == {None}, field
    md = (tmp_path / "out" / "report.md").read_text().split("## Generator bias", 1)[1]
    lines = [ln for ln in md.splitlines() if "| sd15 | sdxl |" in ln]
    cells = r"\| -?\d\.\d{4}( \(no interval: (fewer than 6 clusters|all 3 units equal)\))? \| none \| n/a \| n/a \|$"
    assert len(lines) == 6 and all(re.search(cells, ln) for ln in lines)


def test_a_pair_id_on_two_rows_is_one_line_naming_the_config(fixture, tiny_models_dir, tmp_path, capsys):
    import pyarrow as pa

    tables = fixture["tables"]
    twice = pa.concat_tables([tables["sdxl"], tables["sdxl"].slice(0, 1)])
    folder = write_renderings(tmp_path / "twice", {"sd15": tables["sd15"], "sdxl": twice})
    out = tmp_path / "out"
    args = ["benchmark", "--models", "tiny", "--tiny-models-dir", str(tiny_models_dir)]
    assert cli_main([*args, "--counterfactuals", str(folder), "--output", str(out)]) == 2
    line = error_line(capsys)
    first = twice.column("id")[0].as_py()
    assert f"(config 'sdxl', split 'test') row 3: pair id {first!r} is on two rows" in line
    assert not out.exists()


def test_a_renderings_dataset_on_the_hub_loads_by_config(report, fixture, tiny_models_dir, tmp_path, repo_id):
    """The same folder uploaded as a Hub dataset, given as ID@revision: the same numbers. Pushed
    to a results dataset, each generator's records are rows of their own (`counterfactuals/G`)
    and its card has a table per generator; the generator-bias records stay in results.jsonl."""
    from datasets import load_dataset
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset")
    api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=str(fixture["renderings"]))
    api.create_tag(repo_id, repo_type="dataset", tag="v1")
    _, local = report
    results = f"{repo_id}-results"
    hub = benchmark(tmp_path / "out", f"{repo_id}@v1", tiny_models_dir, "--push-to-hub", results)
    key = lambda r: (r["dataset"], r["model"], r["task"], r.get("other_generator"))  # noqa: E731
    assert {key(r): r["metrics"] for r in hub} == {key(r): r["metrics"] for r in local}
    assert {r["dataset_source"] for r in hub} == {repo_id} and {r["dataset_revision"] for r in hub} == {"v1"}
    rows = load_dataset(results, split="train")
    per_generator = [r for r in hub if r["task"] != "generator_bias"]
    assert len(rows) == len(per_generator) and {r["dataset"] for r in rows} == {r["dataset"] for r in per_generator}
    card = (Path(api.hf_hub_download(results, "README.md", repo_type="dataset"))).read_text()
    assert all(f"## counterfactuals/{g}" in card for g in GENERATORS)
