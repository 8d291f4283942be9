"""`counterfactory benchmark` (training/report/) on the fixture builds with the two tiny CLIPs:
every number equals the trainer's `--eval-only` output for the same model and data, the
comparison ranks correctly, results.jsonl round-trips, bad input is one line naming the flag."""

from __future__ import annotations

import json

import pytest

from builders.app.cli import main as cli_main
from helpers.training_helpers import final_metrics, report_builds
from training.finetune_clip import main as train_main

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    return report_builds(tmp_path_factory.mktemp("builds"), coco_fixture_dir)


@pytest.fixture(scope="module")
def report(builds, tiny_models_dir, tmp_path_factory):
    cc, dec, cf = builds
    out = tmp_path_factory.mktemp("report") / "out"
    assert (
        cli_main(
            [
                "benchmark",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--coco",
                str(cc),
                "--decorrelation",
                str(dec),
                "--counterfactuals",
                str(cf),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_every_number_equals_the_trainers_eval_only(report, builds, tiny_models_dir, tmp_path):
    from builders.models.profiles import tiny_profile
    from training.report.results import read_results

    cc, dec, cf = builds
    # The blind text-only baseline's records (task blind_baseline, its text models) are checked
    # in tests/training/test_report_uncertainty.py; here the image-text models' numbers.
    records = [r for r in read_results(report / "results.jsonl") if r["task"] != "blind_baseline"]
    from builders.engine.provenance import model_name

    profile = tiny_profile(tiny_models_dir)
    # Local folders are named by content, as builds name them, never by a path of this machine.
    assert {r["model"] for r in records} == {model_name(profile.clip), model_name(profile.open_clip)}
    assert str(tiny_models_dir) not in (report / "results.jsonl").read_text()
    assert {(r["dataset"], r["task"]) for r in records} == {
        ("coco", "zeroshot_retrieval"),
        ("coco", "itm"),
        ("decorrelation", "odmap"),
        ("decorrelation", "odmap_per_class"),
        ("decorrelation", "necessity"),
        ("counterfactuals", "itm"),
    }
    for backend, model in (("transformers", profile.clip), ("open_clip", profile.open_clip)):
        out = tmp_path / backend
        assert (
            train_main(
                [
                    "--real",
                    str(cc),
                    "--decorrelation",
                    str(dec),
                    "--counterfactuals",
                    str(cf),
                    "--backend",
                    backend,
                    "--model",
                    model,
                    "--eval-only",
                    "--num-workers",
                    "0",
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
        trainer = final_metrics(out)
        compared = 0
        for r in (r for r in records if r["model"] == model_name(model) and r["task"] != "odmap_per_class"):
            for name, value in r["metrics"].items():
                assert value == pytest.approx(trainer[f"{r['task']}/{name}"], abs=1e-6), (r["task"], name)
                compared += 1
        # PN per removed class: the trainer scores it with --real and --decorrelation together,
        # the report from the two builds' embeddings; every class the trainer has, and its mean.
        assert {k for k in trainer if k.startswith("necessity/")} == {
            f"necessity/{n}"
            for r in records
            if r["model"] == model_name(model) and r["task"] == "necessity"
            for n in r["metrics"]
        }
        (pn,) = [r for r in records if r["model"] == model_name(model) and r["task"] == "necessity"]
        assert json.loads((out / "run.json").read_text())["necessity"] == {"s_kind": pn["s_kind"]}
        # R@K both ways, ODmAP@k, 4 ITM deltas x 3, PN of at least one class and the mean
        assert compared >= 6 + 3 + 2 * 3 * 2 + 2, compared


def test_results_round_trip_and_report(report):
    from training.report.results import read_results

    records = read_results(report / "results.jsonl")
    assert [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()] == records
    for r in records:
        assert {
            "dataset",
            "model",
            "pretrained",
            "task",
            "metrics",
            "weights_digest",
            "dataset_source",
            "dataset_commit",
            "metric_version",
            "code_version",
        } <= set(r)
        assert r["weights_digest"].startswith("sha256:")
    md = (report / "report.md").read_text()
    for n in (0, 1):
        for dataset in ("coco", "counterfactuals"):
            chart = f"itm_deltas-model{n}-{dataset}.png"
            assert (report / chart).stat().st_size > 0 and f"({chart})" in md
    assert "## Comparison" in md and md.count("| dataset | task | metric | value |") == 2


def _record(model, value, metric="ODmAP@1"):
    return {"dataset": "d", "task": "t", "model": model, "metrics": {metric: value}}


def test_comparison_marks_the_best_per_column():
    from training.report.markdown import comparison_table, rank_models

    records = [_record("a", 0.2), _record("b", 0.7), _record("c", None)]
    assert rank_models(records, "d", "t", "ODmAP@1") == ["b", "a"]
    lines = comparison_table(records, "d", ["a", "b", "c"])
    assert lines[2:] == ["| a | 0.2000 |", "| b | **0.7000** |", "| c | n/a |"]
    # Fewer pairs scored the wrong way round is better.
    low = [_record("a", 0.2, "IR_c_frac_below_zero"), _record("b", 0.7, "IR_c_frac_below_zero")]
    assert rank_models(low, "d", "t", "IR_c_frac_below_zero") == ["a", "b"]
    # PN per removed class is left to the per-model tables; the comparison shows its mean.
    pn = [
        {**_record(m, v, "PN_mean"), "task": "necessity", "metrics": {"PN_mean": v, "PN_dog": v}}
        for m, v in (("a", 0.1), ("b", 0.3))
    ]
    lines = comparison_table(pn, "d", ["a", "b"])
    assert (lines[0], lines[-1]) == ("| model | necessity/PN\\_mean |", "| b | **0.3000** |")
    # Names from the user or the data are plain text.
    assert (
        "|"
        not in comparison_table([_record("x|<b>*y*", 1.0)], "d", ["x|<b>*y*"])[2]
        .replace("\\|", "")[2:-2]
        .split(" | ")[0]
    )


def test_bad_inputs_are_one_line_naming_the_flag(builds, tmp_path, capsys):
    cc, dec, cf = builds
    assert (
        cli_main(["benchmark", "--model", str(tmp_path / "nope"), "--coco", str(cc), "--output", str(tmp_path / "a")])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--model" in err and "nope" in err
    assert (
        cli_main(
            [
                "benchmark",
                "--model",
                str(tmp_path / "nope"),
                "--decorrelation",
                str(cc),
                "--output",
                str(tmp_path / "b"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count("--decorrelation") == 1, err


def test_a_hub_revision_that_does_not_exist_is_one_line(builds, repo_id, tmp_path, capsys):
    from builders.models.profiles import tiny_profile

    assert cli_main(["publish", str(builds[1]), "--repo-id", repo_id, "--version", "v1.0.0"]) == 0
    # Built (when this is the first test to need them) before the output is read: building
    # the tiny models prints progress to stderr.
    clip = tiny_profile(None).clip
    capsys.readouterr()
    assert (
        cli_main(
            ["benchmark", "--model", clip, "--decorrelation", f"{repo_id}@v9.9.9", "--output", str(tmp_path / "out")]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--decorrelation" in err and "'v9.9.9' does not exist" in err


def test_odmap_per_class_equals_an_independent_reference(report, builds):
    import numpy as np
    from datasets import load_dataset

    from helpers.reference_odmap import reference_odmap_from_rankings, reference_topk
    from training.report.results import read_results

    dec = builds[1]
    queries = load_dataset(str(dec), "odmap_queries", split="test")
    gallery = load_dataset(str(dec), "odmap_gallery", split="test")
    mentioned = [set(m) for m in gallery["mentioned_classes"]]
    removed, present = [set(r) for r in queries["removed_classes"]], [set(p) for p in queries["present_classes"]]
    records = [r for r in read_results(report / "results.jsonl") if r["task"] == "odmap_per_class"]
    assert len(records) == 2
    for n, record in enumerate(records):
        [saved] = (report / "embeddings").glob(f"decorrelation-{record['weights_digest'][7:23]}-*.npz")
        emb = np.load(saved)
        k_values = [k for k in (1, 5, 10) if k <= len(mentioned)]
        top = reference_topk(emb["query_image"], emb["gallery_text"], max(k_values))
        classes = sorted({c for r in removed for c in r})
        assert classes
        expected = {}
        for c in classes:
            rows = [q for q, r in enumerate(removed) if c in r]
            ref = reference_odmap_from_rankings(
                top[rows], mentioned, [removed[q] for q in rows], [present[q] for q in rows], k_values
            )
            expected.update({f"{c}_ODmAP@{k}": v for k, v in ref.items()})
        assert record["metrics"] == pytest.approx(expected, abs=1e-6)
        assert (report / f"odmap_per_class-model{n}.png").stat().st_size > 0


def test_one_more_model_encodes_only_that_model(report, builds, tiny_models_dir, tmp_path, monkeypatch):
    """The embedding cache: a second report with one more model encodes only the new one, and
    every number equals a report computed from scratch (the `report` fixture, no shared cache)."""
    import training.evaluation
    from builders.models.profiles import tiny_profile
    from training.report.results import read_results

    _, dec, cf = builds
    profile = tiny_profile(tiny_models_dir)
    encoded = []
    encode = training.evaluation.compute_embeddings
    monkeypatch.setattr(
        training.evaluation,
        "compute_embeddings",
        lambda module, *a, **kw: encoded.append(type(module).__name__) or encode(module, *a, **kw),
    )
    common = ["--decorrelation", str(dec), "--counterfactuals", str(cf), "--cache-dir", str(tmp_path / "cache")]
    assert cli_main(["benchmark", "--model", profile.clip, *common, "--output", str(tmp_path / "one")]) == 0
    assert len(encoded) == 2, encoded  # one model x two datasets
    first = encoded[0]
    assert (
        cli_main(
            [
                "benchmark",
                "--model",
                profile.clip,
                "--model",
                profile.open_clip,
                *common,
                "--output",
                str(tmp_path / "two"),
            ]
        )
        == 0
    )
    assert len(encoded) == 4 and first not in encoded[2:], encoded
    two = read_results(tmp_path / "two" / "results.jsonl")
    assert [
        r for r in two if r["model"] == read_results(tmp_path / "one" / "results.jsonl")[0]["model"]
    ] == read_results(tmp_path / "one" / "results.jsonl")
    # Without --coco: no COCO records, and no PN (its x are the --coco split's images); the
    # blind text-only baseline is the report's own (the tiny LM of --models tiny), no CLIP's.
    fresh = [
        r
        for r in read_results(report / "results.jsonl")
        if r["dataset"] != "coco" and r["task"] not in ("necessity", "blind_baseline")
    ]
    assert sorted(two, key=lambda r: (r["model"], r["dataset"], r["task"])) == sorted(
        fresh, key=lambda r: (r["model"], r["dataset"], r["task"])
    )
    assert not list((tmp_path / "two").glob("embeddings"))  # --cache-dir replaces OUTPUT/embeddings


def test_the_cache_tells_preprocessing_apart(builds, tiny_models_dir, tmp_path, monkeypatch):
    """Same weights, other preprocessing (a copy whose processor normalises differently): the
    cache must encode it again; an identical copy of the model is a hit."""
    import shutil

    import training.evaluation
    from builders.models.profiles import tiny_profile

    clip = tiny_profile(tiny_models_dir).clip
    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(clip, same)
    shutil.copytree(clip, other)
    config = json.loads((other / "processor_config.json").read_text())
    config["image_processor"]["image_mean"] = [0.5, 0.5, 0.5]
    (other / "processor_config.json").write_text(json.dumps(config))
    encoded = []
    encode = training.evaluation.compute_embeddings
    monkeypatch.setattr(
        training.evaluation, "compute_embeddings", lambda *a, **kw: encoded.append(1) or encode(*a, **kw)
    )
    common = ["benchmark", "--decorrelation", str(builds[1]), "--cache-dir", str(tmp_path / "cache")]
    for n, model in enumerate((clip, same, other)):
        assert cli_main([*common, "--model", str(model), "--output", str(tmp_path / f"r{n}")]) == 0
    assert len(encoded) == 2  # the original, then the copy that normalises differently


def test_push_to_hub_appends_only_new_records(report, builds, repo_id):
    """Pushing the same records again adds no commit and no row, one more model adds only its
    rows, and `load_dataset` reads the repo (script-free) at its tag."""
    from pathlib import Path

    from datasets import load_dataset
    from huggingface_hub import HfApi

    from training.report.markdown import plain
    from training.report.hub_results import push_results, record_key
    from training.report.results import read_results

    records = read_results(report / "results.jsonl")
    first_model = records[0]["model"]
    ones = [r for r in records if r["model"] == first_model]
    assert 0 < len(ones) < len(records)
    api = HfApi()

    def state():
        commits = api.list_repo_commits(repo_id, repo_type="dataset")
        rows = load_dataset(repo_id, split="train", download_mode="force_redownload")
        return len(commits), rows

    assert push_results(ones, repo_id) == len(ones)
    n_commits, rows = state()
    assert sorted(rows["key"]) == sorted(record_key(r) for r in ones)
    assert push_results(ones, repo_id) == 0
    assert state()[0] == n_commits
    assert push_results(records, repo_id, tag="v1") == len(records) - len(ones)
    n_after, rows = state()
    assert n_after == n_commits + 1 and len(rows) == len(records)
    tagged = load_dataset(repo_id, split="train", revision="v1", download_mode="force_redownload")
    by_key = {r["key"]: r for r in tagged}
    for r in records:
        row = by_key[record_key(r)]
        assert json.loads(row["metrics"]) == r["metrics"] and row["weights_digest"] == r["weights_digest"]
    card = Path(api.hf_hub_download(repo_id, "README.md", repo_type="dataset")).read_text()
    assert "configs:" in card and "| model |" in card
    assert all(plain(m) in card for m in {r["model"] for r in records})


def test_push_to_hub_from_the_command_line(report, builds, tiny_models_dir, repo_id, tmp_path, capsys):
    from datasets import load_dataset

    from builders.engine.provenance import content_digest
    from training.report.hub_results import record_key
    from training.report.results import read_results

    dec = str(builds[1])
    common = ["benchmark", "--models", "tiny", "--tiny-models-dir", str(tiny_models_dir), "--decorrelation", dec]
    assert cli_main([*common, "--push-to-hub", "not a repo", "--output", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a repo" in err and not (tmp_path / "bad").exists()
    # The fixture report's embeddings as the cache: nothing is encoded again.
    assert (
        cli_main(
            [
                *common,
                "--cache-dir",
                str(report / "embeddings"),
                "--push-to-hub",
                repo_id,
                "--output",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    records = read_results(tmp_path / "out" / "results.jsonl")
    rows = load_dataset(repo_id, split="train", download_mode="force_redownload")
    assert sorted(rows["key"]) == sorted(record_key(r) for r in records)
    # Shared rows name local builds and models by content, never by a path of this machine.
    assert all(str(tmp_path.parent.parent) not in str(v) for row in rows for v in row.values())
    assert {r["dataset_source"] for r in records} == {f"local:dec@sha256:{content_digest(builds[1])[:16]}"}
