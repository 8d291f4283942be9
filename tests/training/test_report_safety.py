"""`counterfactory benchmark` and `doctor --json` on hostile input (#32): a poisoned embedding
cache is recomputed (never unpickled, never fatal, the numbers of a clean run), an output flag
that is a file, a folder whose name holds an `@`, a results repo whose rows this tool did not
write (the push refuses and the repo is unchanged): each one line naming the flag/file/row."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from builders.app.cli import main as cli_main
from helpers.training_helpers import report_builds

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    return report_builds(tmp_path_factory.mktemp("builds"), coco_fixture_dir)


def _args(builds, clip: str) -> list[str]:
    cc, dec, cf = builds
    # --coco and --decorrelation together: PN reads both builds' cached embeddings. No blind
    # text-only baseline: its default LM (gpt2-large) is not on this offline machine, and it
    # caches nothing.
    return [
        "benchmark",
        "--model",
        clip,
        "--coco",
        str(cc),
        "--decorrelation",
        str(dec),
        "--counterfactuals",
        str(cf),
        "--blind-lm",
        "none",
    ]


@pytest.fixture(scope="module")
def clean(builds, tiny_models_dir, tmp_path_factory):
    """A report from scratch: its records and its embedding cache."""
    from builders.models.profiles import tiny_profile
    from training.report.results import read_results

    out = tmp_path_factory.mktemp("clean") / "out"
    assert cli_main([*_args(builds, tiny_profile(tiny_models_dir).clip), "--output", str(out)]) == 0
    return read_results(out / "results.jsonl"), out / "embeddings"


class _Trap:
    """Unpickling it creates the file `marker`: the proof that a cached array was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _rewrite_npz(path: Path, change) -> None:
    with np.load(path) as z:
        arrays = {name: change(z[name]) for name in z.files}
    path.unlink()
    with path.open("wb") as f:  # np.savez(str) would append .npz to another name
        np.savez(f, **arrays)


def _halve_width(a: np.ndarray) -> np.ndarray:
    # Consistent shapes, so an unchecked reader computes (other) numbers instead of failing.
    return a[:, : a.shape[1] // 2] if a.ndim == 2 else a[:-1]


def _poison(kind: str, meta: Path, npz: Path, marker: Path, outside: Path) -> None:
    saved = json.loads(meta.read_text())
    if kind == "json-list":
        meta.write_text(json.dumps([saved]))
    elif kind == "no-metrics":
        meta.write_text(json.dumps({"key": saved["key"]}))
    elif kind == "string-values":
        meta.write_text(json.dumps({**saved, "metrics": {k: str(v) for k, v in saved["metrics"].items()}}))
    elif kind == "object-arrays":
        _rewrite_npz(npz, lambda a: np.array([_Trap(marker)] * len(a), dtype=object))
    elif kind == "wrong-shapes":
        _rewrite_npz(npz, _halve_width)
    elif kind == "truncated":
        npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    elif kind == "links-outside":  # an entry that leads out of the cache folder is not read
        outside.mkdir(exist_ok=True)
        for f in (meta, npz):
            shutil.move(f, outside / f.name)
            f.symlink_to(outside / f.name)


POISONS = ("json-list", "no-metrics", "string-values", "object-arrays", "wrong-shapes", "truncated", "links-outside")


@pytest.mark.parametrize("kind", POISONS)
def test_a_poisoned_cache_entry_is_recomputed(kind, clean, builds, tiny_models_dir, tmp_path, caplog):
    from builders.models.profiles import tiny_profile
    from training.report.results import read_results

    records, clean_cache = clean
    cache = tmp_path / "cache"
    shutil.copytree(clean_cache, cache)
    entries = sorted(cache.glob("*.json"))
    assert len(entries) == 3  # coco, decorrelation, counterfactuals
    marker = tmp_path / "unpickled"
    for meta in entries:
        _poison(kind, meta, meta.with_suffix(".npz"), marker, tmp_path / "outside")
    caplog.set_level(logging.WARNING, logger="training.report.cache")
    args = [*_args(builds, tiny_profile(tiny_models_dir).clip), "--cache-dir", str(cache)]
    assert cli_main([*args, "--output", str(tmp_path / "out")]) == 0
    assert not marker.exists()
    # The numbers of a clean run, PN (both builds' embeddings) included.
    assert read_results(tmp_path / "out" / "results.jsonl") == records
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for meta in entries:
        assert any(meta.stem in w and "computing it again" in w for w in warned), (meta, warned)
    # Each entry was written again, as a plain file: the next report reads it without a warning.
    assert not any(f.is_symlink() for f in cache.iterdir())
    caplog.clear()
    assert cli_main([*args, "--output", str(tmp_path / "again")]) == 0
    assert read_results(tmp_path / "again" / "results.jsonl") == records
    assert not [r for r in caplog.records if r.levelno == logging.WARNING and "cache" in r.getMessage()]


@pytest.mark.parametrize("flag", ["--output", "--cache-dir"])
def test_an_output_folder_that_is_a_file_is_one_line(flag, builds, tiny_models_dir, tmp_path, capsys):
    from builders.models.profiles import tiny_profile

    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    folders = {"--output": str(tmp_path / "out"), "--cache-dir": str(tmp_path / "cache"), flag: str(a_file)}
    args = ["benchmark", "--model", tiny_profile(tiny_models_dir).clip, "--decorrelation", str(builds[1])]
    for value in (str(a_file), str(a_file / "below")):
        folders[flag] = value
        assert cli_main([*args, *(x for kv in folders.items() for x in kv)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{flag} {value}" in err, err
        assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize(
    "flag, model",
    [
        ("--model", "open_clip:"),
        ("--model", "hf-hub:"),
        ("--model", "open_clip::openai"),
        ("--baseline", "local-dir:"),
    ],
)
def test_a_model_id_naming_nothing_is_one_line_before_any_input_is_read(flag, model, tmp_path, capsys):
    """Every --model (and --baseline) is parsed before a dataset is opened: the line names the
    flag and the spellings it takes, not the missing build given beside it."""
    from helpers.build_helpers import error_line

    out = tmp_path / "out"
    assert (
        cli_main(["benchmark", flag, model, "--decorrelation", str(tmp_path / "no-such-build"), "--output", str(out)])
        == 2
    )
    line = error_line(capsys)
    assert f"{flag} {model!r} names no model" in line, line
    assert "ARCH[:TAG]" in line and "hf-hub:ORG/REPO" in line and "local-dir:PATH" in line, line
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--counterfactuals", "--decorrelation", "--coco"])
def test_a_missing_dataset_folder_is_one_line(flag, tiny_models_dir, tmp_path, capsys):
    """A local path that does not exist is no repo id either: huggingface_hub's HFValidationError
    came out as a traceback (#49's hostile inputs)."""
    from builders.models.profiles import tiny_profile
    from helpers.build_helpers import error_line

    missing, out = tmp_path / "no-such-build", tmp_path / "out"
    args = ["benchmark", "--model", tiny_profile(tiny_models_dir).clip, flag, str(missing), "--output", str(out)]
    assert cli_main(args) == 2
    line = error_line(capsys)
    assert f"dataset {missing}: no such local folder, and not a Hub repo id" in line, line


def test_a_negative_seed_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """numpy's default_rng refused --seed -1 only after every model was scored (#41)."""
    import training.report.run

    monkeypatch.setattr(training.report.run, "run_benchmark", lambda cfg: pytest.fail("the benchmark ran"))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        cli_main(
            ["benchmark", "--models", "tiny", "--decorrelation", str(tmp_path), "--seed", "-1", "--output", str(out)]
        )
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "argument --seed: must be at least 0 (got -1)" in err.splitlines()[-1], err
    assert not out.exists()


def test_a_local_folder_with_an_at_sign_is_a_local_folder(builds, tiny_models_dir, tmp_path, monkeypatch):
    """`models/clip@v2` and `builds/dec@v2` are folders, not the Hub ids `models/clip` and
    `builds/dec` at revision `v2`: read from disk and named by content, in the report and in
    the trainer's run record."""
    from builders.engine.provenance import content_digest, model_name
    from builders.models.profiles import tiny_profile
    from helpers.training_helpers import final_metrics
    from training.finetune_clip import main as train_main
    from training.report.results import read_results

    clip, dec = tmp_path / "models" / "clip@v2", tmp_path / "builds" / "dec@v2"
    shutil.copytree(tiny_profile(tiny_models_dir).clip, clip)
    shutil.copytree(builds[1], dec)
    monkeypatch.chdir(tmp_path)
    named = f"local:clip@v2@sha256:{content_digest(clip)[:16]}"
    assert model_name("models/clip@v2") == model_name(str(clip)) == named
    assert (
        cli_main(["benchmark", "--model", "models/clip@v2", "--decorrelation", "builds/dec@v2", "--output", "report"])
        == 0
    )
    records = read_results(tmp_path / "report" / "results.jsonl")
    assert records and {r["model"] for r in records} == {named}
    assert {r["dataset_source"] for r in records} == {f"local:dec@v2@sha256:{content_digest(dec)[:16]}"}
    assert {r["dataset_revision"] for r in records} == {None}
    assert (
        train_main(
            [
                "--decorrelation",
                "builds/dec@v2",
                "--model",
                "models/clip@v2",
                "--eval-only",
                "--num-workers",
                "0",
                "--output",
                "run",
            ]
        )
        == 0
    )
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert named in json.dumps(run) and str(tmp_path) not in json.dumps(run)
    # The same build and weights as the report read: the same ODmAP@k.
    trainer = final_metrics(tmp_path / "run")
    odmap = next(r for r in records if r["task"] == "odmap")["metrics"]
    assert odmap == pytest.approx(
        {k.removeprefix("odmap/"): v for k, v in trainer.items() if k.startswith("odmap/")}, abs=1e-6
    )


def _hostile_parquet(kind: str, good: dict) -> bytes:
    if kind == "not-parquet":
        return b"PAR1 this is not a parquet file PAR1"
    row = dict(good)
    if kind == "metrics-not-json":
        row["metrics"] = "{not json"
    elif kind == "metrics-a-list":
        row["metrics"] = json.dumps([1.0, 2.0])
    elif kind == "string-values":
        row["metrics"] = json.dumps({"ODmAP@1": "0.9"})
    elif kind == "method-a-number":
        row["ci_method"] = json.dumps({"ODmAP@1": 3})
    elif kind in ("metrics-nan", "metrics-infinity"):  # Python's json writes and reads them by default
        row["metrics"] = json.dumps({"ODmAP@1": float("nan" if kind == "metrics-nan" else "inf")})
    elif kind == "metrics-deep":  # a RecursionError, not a JSONDecodeError
        row["metrics"] = '{"ODmAP@1": ' + "[" * 100_000 + "]" * 100_000 + "}"
    rows = [good, row]  # row 1 is the hostile one
    if kind == "no-key-column":
        rows = [{k: v for k, v in r.items() if k != "key"} for r in rows]
    return _parquet(rows)


def _parquet(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


#: What the error line says of each hostile row (#49: NaN, Infinity and deep nesting were
#: accepted and shown, or a RecursionError).
SAYS = {
    "metrics-nan": "'metrics' holds NaN, not a finite number",
    "metrics-infinity": "'metrics' holds Infinity, not a finite number",
    "metrics-deep": "'metrics' is JSON nested too deep to read",
}


@pytest.mark.parametrize(
    "kind",
    [
        *("metrics-not-json", "metrics-a-list", "string-values", "method-a-number", "no-key-column", "not-parquet"),
        *SAYS,
    ],
)
def test_hostile_repo_rows_refuse_the_push(kind, clean, builds, tiny_models_dir, repo_id, tmp_path, capsys):
    from huggingface_hub import HfApi

    from builders.models.profiles import tiny_profile
    from training.report.hub_results import to_row

    records, cache = clean
    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset")
    good = to_row({**records[0], "model": "someone-elses-model"})
    api.upload_file(
        repo_id=repo_id,
        repo_type="dataset",
        path_in_repo="data/theirs.parquet",
        path_or_fileobj=_hostile_parquet(kind, good),
    )
    before = api.repo_info(repo_id, repo_type="dataset").sha
    files = sorted(api.list_repo_files(repo_id, repo_type="dataset"))
    commits = len(api.list_repo_commits(repo_id, repo_type="dataset"))
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                *_args(builds, tiny_profile(tiny_models_dir).clip),
                "--cache-dir",
                str(cache),
                "--push-to-hub",
                repo_id,
                "--output",
                str(out),
            ]
        )
        == 2
    )
    # The scoring's progress bars share stderr: one error line, no traceback.
    stderr = capsys.readouterr().err
    [err] = [line for line in stderr.splitlines() if line.startswith("counterfactory: error:")]
    assert "Traceback" not in stderr and f"{repo_id}: data/theirs.parquet" in err, err
    if kind != "not-parquet" and kind != "no-key-column":
        assert "row 1" in err, err
    assert SAYS.get(kind, "") in err, err
    assert api.repo_info(repo_id, repo_type="dataset").sha == before
    assert sorted(api.list_repo_files(repo_id, repo_type="dataset")) == files
    assert len(api.list_repo_commits(repo_id, repo_type="dataset")) == commits
    # What the report built is kept.
    assert (out / "results.jsonl").is_file() and (out / "report.md").is_file()


def test_doctor_json_given_a_folder_is_one_line(tiny_models_dir, tmp_path, capsys):
    folder = tmp_path / "reports"
    folder.mkdir()
    args = [
        "doctor",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--stages",
        "mitl-embed",
        "--resolution",
        "64",
        "--steps",
        "1",
        "--json",
    ]
    assert cli_main([*args, str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--json {folder}" in err and "folder" in err, err
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    assert cli_main([*args, str(a_file / "doctor.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--json {a_file / 'doctor.json'}" in err, err
    assert a_file.read_text() == "mine\n" and list(folder.iterdir()) == []


def _table_rows(markdown: str) -> list[list[int]]:
    """Per table (a run of lines starting with `|`), each row's number of cells (split on the
    `|` no backslash escapes), as a Markdown reader splits the lines of the file."""
    tables: list[list[int]] = []
    previous = False
    for line in markdown.splitlines():
        row = line.startswith("|")
        if row and not previous:
            tables.append([])
        if row:
            tables[-1].append(len(re.split(r"(?<!\\)\|", line)))
        previous = row
    return tables


def test_a_line_break_in_a_model_name_stays_in_its_table_row(builds, tiny_models_dir, repo_id, tmp_path):
    """A `\\r` in a `--model` folder's name, and in a past row's model, ended the table row in
    report.md and in the results card (`markdown.plain` replaced only `\\n`, #49)."""
    from huggingface_hub import HfApi, hf_hub_download

    from builders.models.profiles import tiny_profile
    from training.report.hub_results import to_row
    from training.report.results import read_results

    clip = tmp_path / "clip\rsecond\u2028line"
    shutil.copytree(tiny_profile(tiny_models_dir).clip, clip)
    out = tmp_path / "out"
    argv = ["benchmark", "--model", str(clip), "--decorrelation", str(builds[1]), "--output", str(out)]
    assert cli_main(argv) == 0
    records = read_results(out / "results.jsonl")
    theirs = [to_row({**r, "model": "theirs\rmodel\x85x", "weights_digest": "0" * 64}) for r in records]
    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset")
    api.upload_file(
        repo_id=repo_id, repo_type="dataset", path_in_repo="data/theirs.parquet", path_or_fileobj=_parquet(theirs)
    )
    assert cli_main([*argv, "--push-to-hub", repo_id]) == 0
    card = Path(hf_hub_download(repo_id, "README.md", repo_type="dataset")).read_text()
    for name, text in (("report.md", (out / "report.md").read_text()), ("README.md", card)):
        tables = _table_rows(text)
        assert tables and all(len(t) >= 3 for t in tables), (name, text)  # header, rule, a row
        assert all(len(set(t)) == 1 for t in tables), (name, tables)
    assert "theirs model x" in card and "clip second line" in card
