"""A path named by data never leaves the root the user declared (issue #21 §1).

Each case edits one image of a copy of the COCO fixture so that its `file_name` leads outside the
root (`..`, an absolute path, a symlink in the image folder, a symlinked folder) to a "secret"
image that would otherwise be embedded, then builds through the CLI. Every case asserts: exit 0,
that image counted once as `path_outside_root` (stats and manifest), every other row identical to
a clean build, no decoded image of the output equal to the secret, and (for the in-process
`coco-captions` build) that nothing under the secret's folder was even stat'ed, resolved or
opened. The same for Flickr30k, for `--dataset` sources of `coco-counterfactuals`, and for the
dataset gallery of `counterfactory eccv candidates`.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.app.cli import main as cli_main

from helpers.build_helpers import (
    captions_build,
    decorrelation_build,
    eccv_build,
    errors_everywhere,
    fixture_case,
    without_target,
)
from helpers.build_helpers import rows_by_output
from helpers.decorrelation_fixtures import flickr_entities
from helpers.eccv_fixtures import package_json, write_test_image_root

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REASON = "path_outside_root"


def secret_image(path: Path, size: tuple[int, int]) -> np.ndarray:
    """A noise image (so no fixture image can equal it by chance) at `path`; its pixels."""
    pixels = np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")
    return pixels


def output_images(out: Path) -> list[np.ndarray]:
    """Every embedded image cell of every shard, decoded."""
    found = []
    for shard in sorted((out / "data").rglob("*.parquet")):
        for column in pq.read_table(shard).to_pylist():
            for value in column.values():
                if isinstance(value, dict) and isinstance(value.get("bytes"), bytes):
                    found.append(np.asarray(Image.open(io.BytesIO(value["bytes"])).convert("RGB")))
    return found


def assert_secret_absent(out: Path, secret: Path, pixels: np.ndarray) -> None:
    data = secret.read_bytes()
    assert all(data not in p.read_bytes() for p in out.rglob("*") if p.is_file())
    images = output_images(out)
    assert images, "the build embedded no image at all"
    assert not any(im.shape == pixels.shape and np.array_equal(im, pixels) for im in images)


class TouchSpy:
    """Records every path given to stat / lstat / open / readlink while installed; `under` says
    which of them reached into a folder, following symlinks as the call did (`lstat` and
    `readlink` follow all but the last component), resolved after the run."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, bool]] = []
        for module, name in (
            (os, "stat"),
            (os, "lstat"),
            (os, "open"),
            (os, "readlink"),
            (builtins, "open"),
            (io, "open"),
        ):
            follows = name not in ("lstat", "readlink")
            monkeypatch.setattr(module, name, self._spy(getattr(module, name), follows))

    def _spy(self, real: Callable, follows: bool) -> Callable:
        def spy(path, *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)):
                self.calls.append((os.fsdecode(path), follows and kwargs.get("follow_symlinks", True)))
            return real(path, *args, **kwargs)

        return spy

    def under(self, folder: Path) -> list[str]:
        folder_real = os.path.realpath(folder)
        reached = []
        for path, follows in self.calls:
            path = os.path.abspath(path)
            head, tail = os.path.split(path)
            where = os.path.realpath(path) if follows else os.path.join(os.path.realpath(head), tail)
            if where == folder_real or where.startswith(folder_real + os.sep):
                reached.append(path)
        return reached


# ------------------------------------------------------------------------------ mutations


def set_file_name(case: dict, name: str) -> None:
    """Give the target image `name` as its file_name in every COCO annotation file."""
    for path in (case["root"] / "annotations").glob(f"*_{case['folder']}.json"):
        data = json.loads(path.read_text())
        for entry in data["images"]:
            if entry["id"] == case["target"]:
                entry["file_name"] = name
        path.write_text(json.dumps(data))


def dotdot(case: dict) -> None:
    set_file_name(case, os.path.relpath(case["secret"], case["root"] / case["folder"]))


def absolute(case: dict) -> None:
    set_file_name(case, str(case["secret"]))


def symlinked_file(case: dict) -> None:
    case["image"].unlink()
    case["image"].symlink_to(case["secret"])


def symlinked_folder(case: dict) -> None:
    (case["root"] / case["folder"] / "more").symlink_to(case["secret"].parent, target_is_directory=True)
    set_file_name(case, f"more/{case['secret'].name}")


def absolute_missing(case: dict) -> None:
    # Outside and absent: the same reason as outside and present, so nothing is revealed.
    set_file_name(case, str(case["secret"].parent / "no-such-file.png"))


ESCAPES = [
    pytest.param(f, id=f.__name__.replace("_", "-"))
    for f in (dotdot, absolute, symlinked_file, symlinked_folder, absolute_missing)
]


def make_case(clean: dict, tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "coco"
    shutil.copytree(clean["root"], root, symlinks=True)
    secret = tmp_path / "outside" / "secret.png"
    pixels = secret_image(secret, clean["size"])
    return {
        **clean,
        "root": root,
        "image": root / clean["image"].relative_to(clean["root"]),
        "secret": secret,
        "pixels": pixels,
        "out": tmp_path / "out",
    }


# ------------------------------------------------------------------------------ coco-captions


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("containment")
    clean = fixture_case(base)
    assert captions_build(clean["root"], base / "clean") == 0
    return {**clean, "rows": rows_by_output(base / "clean")}


@pytest.mark.parametrize("escape", ESCAPES)
def test_coco_captions_never_reads_outside_the_root(coco, tmp_path, monkeypatch, escape):
    case = make_case(coco, tmp_path)
    escape(case)
    spy = TouchSpy(monkeypatch)
    code = captions_build(case["root"], case["out"])
    monkeypatch.undo()
    assert code == 0
    assert spy.under(case["secret"].parent) == []
    assert errors_everywhere(case["out"]) == ({REASON: 1}, {REASON: 1})
    assert rows_by_output(case["out"]) == without_target(coco["rows"], coco["target"])
    assert_secret_absent(case["out"], case["secret"], case["pixels"])
    assert REASON in (case["out"] / "README.md").read_text()


def test_paths_that_stay_inside_the_root_are_followed(coco, tmp_path):
    """The policy refuses leaving the root, not symlinks: an image folder that is itself a symlink
    (to another disk), a `..` that comes back inside, and a symlink to another image of the root
    all build exactly as the clean build."""
    case = make_case(coco, tmp_path)
    folder = case["root"] / case["folder"]
    elsewhere = tmp_path / "disk" / case["folder"]
    elsewhere.parent.mkdir()
    shutil.move(str(folder), str(elsewhere))
    folder.symlink_to(elsewhere, target_is_directory=True)
    moved = elsewhere / case["image"].name
    copy = elsewhere / "copies" / case["image"].name
    copy.parent.mkdir()
    moved.rename(copy)
    moved.symlink_to(Path("copies") / case["image"].name)
    set_file_name(case, f"../{case['folder']}/{case['image'].name}")
    assert captions_build(case["root"], case["out"]) == 0
    assert json.loads((case["out"] / "build_manifest.json").read_text())["errors"] == {}
    assert rows_by_output(case["out"]) == coco["rows"]


def test_a_karpathy_folder_that_is_no_folder_name_is_refused(coco, tmp_path, capsys):
    case = make_case(coco, tmp_path)
    path = case["root"] / "dataset_coco.json"
    data = json.loads(path.read_text())
    entry = next(e for e in data["images"] if e["cocoid"] == case["target"])
    entry["filepath"] = "../outside"
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert captions_build(case["root"], case["out"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "'../outside'" in err and "dataset_coco.json" in err


# ------------------------------------------------------------------------------ decorrelation


@pytest.fixture(scope="module")
def decorrelation_clean(coco, tmp_path_factory, tiny_models_dir, nltk_data_dir) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("decorrelation") / "clean"
    assert decorrelation_build(coco["root"], out, tiny_models_dir) == 0
    rows = rows_by_output(out)
    assert any(r.get("image_id") == coco["target"] for rs in rows.values() for r in rs)
    return {**coco, "rows": rows}


@pytest.mark.parametrize("escape", [dotdot, absolute, symlinked_file], ids=lambda f: f.__name__)
def test_decorrelation_never_reads_outside_the_root(decorrelation_clean, tmp_path, tiny_models_dir, escape):
    case = make_case(decorrelation_clean, tmp_path)
    escape(case)
    assert decorrelation_build(case["root"], case["out"], tiny_models_dir) == 0
    assert errors_everywhere(case["out"]) == ({REASON: 1}, {REASON: 1})
    assert rows_by_output(case["out"]) == without_target(decorrelation_clean["rows"], case["target"])
    assert_secret_absent(case["out"], case["secret"], case["pixels"])


@pytest.mark.parametrize("how", ["dotdot", "symlink"])
def test_flickr30k_never_reads_outside_the_root(tmp_path, tiny_models_dir, how):
    root = tmp_path / "f30k"
    flickr_entities(root)
    assert decorrelation_build(root, tmp_path / "clean", tiny_models_dir, "--flickr30k-root", str(root)) == 0
    karpathy_path = root / "dataset_flickr30k.json"
    karpathy = json.loads(karpathy_path.read_text())
    entry = next(e for e in karpathy["images"] if e["split"] == "train")
    target = int(Path(entry["filename"]).stem)
    secret = tmp_path / "outside" / entry["filename"]  # the same stem: the same image id
    pixels = secret_image(secret, (128, 96))
    if how == "dotdot":
        entry["filename"] = os.path.relpath(secret, root / "flickr30k-images")
        karpathy_path.write_text(json.dumps(karpathy))
    else:
        (root / "flickr30k-images" / secret.name).unlink()
        (root / "flickr30k-images" / secret.name).symlink_to(secret)
    out = tmp_path / "out"
    assert decorrelation_build(root, out, tiny_models_dir, "--flickr30k-root", str(root)) == 0
    assert errors_everywhere(out) == ({REASON: 1}, {REASON: 1})
    assert rows_by_output(out) == without_target(rows_by_output(tmp_path / "clean"), target)
    assert_secret_absent(out, secret, pixels)


# ------------------------------------------------------------------------------ eccv-positives


@pytest.fixture(scope="module")
def eccv(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("eccv_containment")
    images = sorted(random.Random(5).sample(sorted(package_json("eccv", "i2t")), 4))
    root = write_test_image_root(base / "coco", {i: [1] for i in images})
    assert eccv_build(root, base / "clean") == 0
    target = images[1]
    return {
        "root": root,
        "folder": "val2014",
        "target": target,
        "size": (8, 6),
        "image": root / "val2014" / f"COCO_val2014_{target:012d}.jpg",
        "rows": rows_by_output(base / "clean"),
    }


@pytest.mark.parametrize("escape", [dotdot, absolute, symlinked_file], ids=lambda f: f.__name__)
def test_eccv_positives_never_reads_outside_the_root(eccv, tmp_path, escape):
    case = make_case(eccv, tmp_path)
    escape(case)
    assert eccv_build(case["root"], case["out"]) == 0
    assert errors_everywhere(case["out"]) == ({REASON: 1}, {REASON: 1})
    rows = rows_by_output(case["out"])
    own = set(package_json("coco", "i2t")[case["target"]])
    # As for any malformed record: the image row is skipped, its captions' texts are null.
    expected = {
        **eccv["rows"],
        "i2t/test": [
            {
                **r,
                "positive_captions": [
                    None if c in own else t
                    for c, t in zip(r["positive_caption_ids"], r["positive_captions"], strict=True)
                ],
            }
            for r in eccv["rows"]["i2t/test"]
            if r["image_id"] != case["target"]
        ],
        "t2i/test": [{**r, "caption": None} if r["caption_id"] in own else r for r in eccv["rows"]["t2i/test"]],
    }
    assert {k: rows[k] for k in ("i2t/test", "t2i/test", "removed/test")} == {
        k: expected[k] for k in ("i2t/test", "t2i/test", "removed/test")
    }
    assert_secret_absent(case["out"], case["secret"], case["pixels"])


# ------------------------------------------------------------------------------ dataset sources


def write_parquet(folder: Path, columns: dict[str, list], features) -> None:
    """A one-file parquet dataset, written as is (`to_parquet` would stat the cells' paths)."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    table = datasets.Dataset.from_dict(columns, features=datasets.Features(features)).data.table
    pq.write_table(table, folder / "test.parquet")


def test_a_dataset_source_never_opens_an_image_path(tmp_path, tiny_models_dir, monkeypatch):
    """`coco-counterfactuals --dataset` reads text: an Image-typed text column of path-only cells
    (pointing at a local file) is a counted `bad_caption`, never a file read."""
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not for the dataset")
    import datasets

    source = tmp_path / "captions"
    write_parquet(source, {"text": [{"bytes": None, "path": str(secret)}]}, {"text": datasets.Image()})
    spy = TouchSpy(monkeypatch)
    code = cli_main(
        [
            "build",
            "coco-counterfactuals",
            "--stage",
            "captions",
            "--dataset",
            str(source),
            "--dataset-split",
            "test",
            "--text-column",
            "text",
            "--models",
            "tiny",
            "--max-error-fraction",
            "1",
            "--tiny-models-dir",
            str(tiny_models_dir),
            "--output",
            str(tmp_path / "out"),
        ]
    )
    monkeypatch.undo()
    assert code == 0
    assert spy.under(secret.parent) == []
    assert json.loads((tmp_path / "out/build_manifest.json").read_text())["errors"] == {"bad_caption": 1}


def test_the_eccv_dataset_gallery_opens_no_path_outside_its_folder(gallery, annotators, tmp_path, monkeypatch):
    """A `--dataset` gallery row whose image cell has no bytes is read from its path only inside
    the dataset folder (as a local image folder gives them): a path outside it leaves the row out,
    counted in the candidates file, and is never touched."""
    import datasets

    secret = tmp_path / "outside" / "secret.png"
    secret_image(secret, (128, 96))
    paths = gallery["paths"][:5]
    cells = [{"bytes": p.read_bytes(), "path": None} for p in paths[:4]]
    folder = tmp_path / "dataset"
    local = folder / "images" / "local.jpg"
    local.parent.mkdir(parents=True)
    shutil.copy(paths[4], local)
    write_parquet(
        folder,
        {
            "image": cells
            + [
                {"bytes": None, "path": str(local)},
                {"bytes": None, "path": str(secret)},
                {"bytes": None, "path": "../outside/secret.png"},
            ],
            "caption": [f"caption {n}" for n in range(7)],
        },
        {"image": datasets.Image(), "caption": datasets.Value("string")},
    )
    spy = TouchSpy(monkeypatch)
    code = cli_main(
        [
            "eccv",
            "candidates",
            "--dataset",
            str(folder),
            "--text-column",
            "caption",
            "--model",
            annotators[0],
            "--image-queries",
            "2",
            "--caption-queries",
            "2",
            "--k",
            "1",
            "--exclusion-depth",
            "2",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--output",
            str(tmp_path / "c.json"),
        ]
    )
    monkeypatch.undo()
    assert code == 0
    assert spy.under(secret.parent) == []
    made = json.loads((tmp_path / "c.json").read_text())
    assert made["config"]["gallery_left_out"] == {REASON: 2}
    assert [im["image_id"] for im in made["gallery"]["images"]] == [0, 1, 2, 3, 4]
    assert [c["text"] for c in made["gallery"]["captions"]] == [f"caption {n}" for n in range(5)]


def test_the_eccv_coco_gallery_leaves_out_a_path_outside_the_root(coco, annotators, tmp_path, monkeypatch, capsys):
    """`eccv candidates --coco-root`: a record whose file is outside the root is left out of the
    gallery (counted), never opened; `eccv tasks` checks the files a candidates file names again,
    so an edited one cannot make it embed an outside file as a thumbnail."""
    case = make_case(coco, tmp_path)
    dotdot(case)
    args = [
        "--splits",
        "train",
        "restval",
        "val",
        "test",
        "--model",
        annotators[0],
        "--image-queries",
        "0",
        "--caption-queries",
        "20",
        "--k",
        "1",
        "--exclusion-depth",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    spy = TouchSpy(monkeypatch)
    code = cli_main(
        ["eccv", "candidates", "--coco-root", str(case["root"]), *args, "--output", str(tmp_path / "c.json")]
    )
    monkeypatch.undo()
    assert code == 0
    assert spy.under(case["secret"].parent) == []
    made = json.loads((tmp_path / "c.json").read_text())
    assert made["config"]["gallery_left_out"] == {REASON: 1}
    images = [im["image_id"] for im in made["gallery"]["images"]]
    assert case["target"] not in images and len(images) == 7
    assert case["target"] not in {c["image_id"] for c in made["gallery"]["captions"]}

    escape = os.path.relpath(case["secret"], case["root"] / case["folder"])
    for image in made["gallery"]["images"]:
        image["file"] = f"{case['folder']}/{escape}"
    (tmp_path / "edited.json").write_text(json.dumps(made))
    capsys.readouterr()
    spy = TouchSpy(monkeypatch)
    code = cli_main(
        ["eccv", "tasks", str(tmp_path / "edited.json"), "--output", str(tmp_path / "tasks"), "--embed-thumbnails"]
    )
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and f"outside the root {case['root']}" in err
    assert spy.under(case["secret"].parent) == []
