"""A corpus of malformed COCO inputs, each made from the tiny fixture and built with the cheapest
builder (`coco-captions`) through the CLI (and a few through the other builders that read COCO).

Every case asserts one of two outcomes:
- the file cannot be trusted as a whole (repeated ids, broken JSON, ...): exit 2 and exactly one
  `counterfactory: error:` line naming the problem, no traceback;
- one image's annotations or pixels are malformed: exit 0, that image counted once under its
  reason in the manifest's `errors`, and every other row byte-for-byte what a clean build wrote.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture

from helpers.build_helpers import rows_by_output
from helpers.eccv_fixtures import package_json, write_test_image_root

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

SPLITS = ("test", "val")


def build(root: Path, out: Path, *extra: str) -> int:
    return cli_main(
        [
            "build",
            "coco-captions",
            "--coco-root",
            str(root),
            "--splits",
            *SPLITS,
            "--output",
            str(out),
            "--part-size",
            "2",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict[str, Any]:
    """The fixture, a clean build of it, and the image every case breaks."""
    base = tmp_path_factory.mktemp("bad_inputs")
    root = write_coco_fixture(base / "coco", CocoFixtureConfig(n_images=8))
    assert build(root, base / "clean") == 0
    karpathy = json.loads((root / "dataset_coco.json").read_text())["images"]
    test_ids = sorted(e["cocoid"] for e in karpathy if e["split"] == "test")
    target = test_ids[1]
    entry = next(e for e in karpathy if e["cocoid"] == target)
    return {
        "root": root,
        "rows": rows_by_output(base / "clean"),
        "target": target,
        "image": root / entry["filepath"] / entry["filename"],
        "folder": entry["filepath"],
    }


# ---------------------------------------------------------------------------------- mutations


def _edit(kind: str) -> Callable[[Callable[[dict, int], None]], Callable[[dict], None]]:
    """Decorate `fn(data, target_id)` into a mutation of `annotations/{kind}_{folder}.json`."""

    def wrap(fn):
        def mutate(case: dict) -> None:
            path = case["root"] / "annotations" / f"{kind}_{case['folder']}.json"
            data = json.loads(path.read_text())
            fn(data, case["target"])
            path.write_text(json.dumps(data))  # allow_nan: NaN/Infinity literals as json.load reads them

        return mutate

    return wrap


def _first(data: dict, image_id: int) -> dict:
    return next(a for a in data["annotations"] if a["image_id"] == image_id)


def _set_box(value):
    return _edit("instances")(lambda d, t: _first(d, t).__setitem__("bbox", value))


def _set_inst(field, value):
    return _edit("instances")(lambda d, t: _first(d, t).__setitem__(field, value))


def _set_caption(value):
    return _edit("captions")(lambda d, t: _first(d, t).__setitem__("caption", value))


def _set_image(field, value, kind="captions"):
    def fn(d, t):
        entry = next(e for e in d["images"] if e["id"] == t)
        if value is _DELETE:
            del entry[field]
        else:
            entry[field] = value

    return _edit(kind)(fn)


_DELETE = object()


def _del_inst_field(field):
    return _edit("instances")(lambda d, t: _first(d, t).pop(field))


def _duplicate_image(kind):
    def fn(d, t):
        other = next(e for e in d["images"] if e["id"] != t)
        d["images"].append({**other, "id": t})

    return _edit(kind)(fn)


def _duplicate_annotation(kind):
    def fn(d, t):
        other = next(a for a in d["annotations"] if a["image_id"] != t)
        other["id"] = _first(d, t)["id"]

    return _edit(kind)(fn)


def _orphan_annotation(kind):
    return _edit(kind)(lambda d, t: d["annotations"].append({**_first(d, t), "id": 10**9, "image_id": 999_999}))


def _drop_image(kind):
    def fn(d, t):
        d["images"] = [e for e in d["images"] if e["id"] != t]
        d["annotations"] = [a for a in d["annotations"] if a["image_id"] != t]

    return _edit(kind)(fn)


def _write_file(name: str, data: bytes):
    def mutate(case):
        (case["root"] / name).write_bytes(data)

    return mutate


def _annotation_bytes(kind: str, transform: Callable[[bytes], bytes]):
    def mutate(case):
        path = case["root"] / "annotations" / f"{kind}_{case['folder']}.json"
        path.write_bytes(transform(path.read_bytes()))

    return mutate


def _karpathy(fn):
    def mutate(case):
        path = case["root"] / "dataset_coco.json"
        data = json.loads(path.read_text())
        fn(data["images"], case["target"])
        path.write_text(json.dumps(data))

    return mutate


def _karpathy_duplicate(images, target):
    images.append(dict(next(e for e in images if e["cocoid"] == target)))


def _karpathy_drop_split(images, target):
    del next(e for e in images if e["cocoid"] == target)["split"]


def _image_bytes(transform: Callable[[bytes], bytes]):
    def mutate(case):
        case["image"].write_bytes(transform(case["image"].read_bytes()))

    return mutate


def _remove_image(case):
    case["image"].unlink()


def _remove(relpath: str):
    def mutate(case):
        (case["root"] / relpath.format(folder=case["folder"])).unlink()

    return mutate


def _nameless_category(case):
    _edit("instances")(lambda d, t: d["categories"][0].pop("name"))(case)


def _huge_image(case):
    # Over the pixel limit set in the test (PIL's real limit is ~89 M pixels): a decompression bomb.
    Image.new("RGB", (400, 300)).save(case["image"], format="JPEG")


def _surrogate_caption(case):
    path = case["root"] / "annotations" / f"captions_{case['folder']}.json"
    data = json.loads(path.read_text())
    _first(data, case["target"])["caption"] = "a dog \ud800 on a sofa"
    path.write_text(json.dumps(data))  # ensure_ascii writes the lone surrogate as \\ud800


# Whole-file problems: exit 2 with one line containing the text.
FILE_ERRORS = [
    pytest.param(_duplicate_image("captions"), "both have id", id="duplicate-image-id-captions"),
    pytest.param(_duplicate_image("instances"), "both have id", id="duplicate-image-id-instances"),
    pytest.param(_duplicate_annotation("captions"), "both have id", id="duplicate-caption-id"),
    pytest.param(_duplicate_annotation("instances"), "both have id", id="duplicate-annotation-id"),
    pytest.param(_orphan_annotation("captions"), "not in 'images'", id="caption-of-unknown-image"),
    pytest.param(_orphan_annotation("instances"), "not in 'images'", id="box-of-unknown-image"),
    pytest.param(_edit("captions")(lambda d, t: _first(d, t).pop("id")), "no integer 'id'", id="caption-without-id"),
    pytest.param(_set_image("id", "1007"), "no integer 'id'", id="image-id-is-a-string"),
    pytest.param(_annotation_bytes("captions", lambda b: b[:300]), "malformed JSON at line", id="truncated-json"),
    pytest.param(_annotation_bytes("captions", lambda b: b"\xff\xfe" + b), "is not UTF-8", id="not-utf8"),
    pytest.param(_annotation_bytes("captions", lambda b: b"[]"), "holds a JSON list", id="json-list"),
    pytest.param(
        _edit("captions")(lambda d, t: d.pop("annotations")), "has no 'annotations' list", id="no-annotations-list"
    ),
    pytest.param(_remove("annotations/instances_{folder}.json"), "instances file is missing", id="missing-instances"),
    pytest.param(_remove("annotations/captions_{folder}.json"), "captions file is missing", id="missing-captions"),
    pytest.param(_remove("dataset_coco.json"), "Karpathy split file is missing", id="missing-karpathy"),
    pytest.param(_karpathy(_karpathy_duplicate), "both have cocoid", id="duplicate-cocoid"),
    pytest.param(_karpathy(_karpathy_drop_split), "lacks cocoid/filepath/split", id="karpathy-entry-without-split"),
    pytest.param(_nameless_category, "lacks an integer id or a name", id="category-without-name"),
]

# Per-image problems: counted once under the reason, the image skipped, the rest identical.
ROW_ERRORS = [
    pytest.param(_set_box("1234"), "bad_bbox", id="bbox-string-digits"),
    pytest.param(_set_box("10,10,20,20"), "bad_bbox", id="bbox-comma-string"),
    pytest.param(_set_box([10, 10, 20]), "bad_bbox", id="bbox-3-numbers"),
    pytest.param(_set_box([10, 10, 20, 20, 5]), "bad_bbox", id="bbox-5-numbers"),
    pytest.param(_set_box([10, 10, float("nan"), 20]), "bad_bbox", id="bbox-nan"),
    pytest.param(_set_box([10, 10, float("inf"), 20]), "bad_bbox", id="bbox-infinity"),
    pytest.param(_set_box([10, 10, -20, 20]), "bad_bbox", id="bbox-negative-width"),
    pytest.param(_set_box([-5, 10, 20, 20]), "bad_bbox", id="bbox-negative-x"),
    pytest.param(_set_box(None), "bad_bbox", id="bbox-null"),
    pytest.param(_set_box([True, 10, 20, 20]), "bad_bbox", id="bbox-boolean"),
    pytest.param(_set_box(["10", "10", "20", "20"]), "bad_bbox", id="bbox-number-strings"),
    pytest.param(_set_inst("category_id", 999), "unknown_category", id="unknown-category-id"),
    pytest.param(_set_inst("category_id", "18"), "unknown_category", id="category-id-string"),
    pytest.param(_set_inst("area", "big"), "bad_area", id="area-not-a-number"),
    pytest.param(_set_inst("area", -3.0), "bad_area", id="area-negative"),
    pytest.param(_set_inst("iscrowd", 2), "bad_annotation", id="iscrowd-2"),
    pytest.param(_del_inst_field("bbox"), "bad_annotation", id="annotation-without-bbox"),
    pytest.param(_del_inst_field("category_id"), "bad_annotation", id="annotation-without-category"),
    pytest.param(_set_image("width", _DELETE), "bad_image_entry", id="image-without-width"),
    pytest.param(_set_image("height", 0), "bad_image_entry", id="image-height-zero"),
    pytest.param(_set_image("width", "128"), "bad_image_entry", id="image-width-string"),
    pytest.param(_set_image("file_name", _DELETE), "bad_image_entry", id="image-without-file-name"),
    pytest.param(_drop_image("instances"), "bad_image_entry", id="image-missing-from-instances"),
    pytest.param(_set_caption(None), "bad_caption", id="caption-null"),
    pytest.param(_set_caption(12345), "bad_caption", id="caption-number"),
    pytest.param(_set_caption(["a", "list"]), "bad_caption", id="caption-list"),
    pytest.param(_set_caption({"text": "a dog"}), "bad_caption", id="caption-object"),
    pytest.param(_set_caption("   \t "), "blank_caption", id="caption-whitespace"),
    pytest.param(_set_caption(""), "blank_caption", id="caption-empty"),
    pytest.param(_surrogate_caption, "bad_caption", id="caption-lone-surrogate"),
    pytest.param(_image_bytes(lambda b: b[:200]), "unreadable_image", id="image-truncated"),
    pytest.param(_image_bytes(lambda b: b"not an image at all"), "unreadable_image", id="image-not-an-image"),
    pytest.param(_remove_image, "unreadable_image", id="image-missing"),
    pytest.param(_huge_image, "image_too_large", id="image-decompression-bomb"),
]


@pytest.fixture
def case(clean, tmp_path, monkeypatch) -> dict[str, Any]:
    # A limit below the bomb case's 400x300 and above the fixture's 128x96 images.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40_000)
    root = tmp_path / "coco"
    shutil.copytree(clean["root"], root)
    return {**clean, "root": root, "image": root / clean["image"].relative_to(clean["root"]), "out": tmp_path / "out"}


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("counterfactory: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("mutate, message", FILE_ERRORS)
def test_untrustworthy_file_is_one_clear_error(case, mutate, message, capsys):
    mutate(case)
    capsys.readouterr()
    assert build(case["root"], case["out"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert message in line
    assert not (case["out"] / ".parts/run.json").exists(), "no fingerprint for a failed read"


@pytest.mark.parametrize("mutate, reason", ROW_ERRORS)
def test_malformed_row_is_a_counted_skip_and_the_rest_is_identical(case, mutate, reason):
    mutate(case)
    assert build(case["root"], case["out"], "--max-error-fraction", "0.5") == 0
    manifest = json.loads((case["out"] / "build_manifest.json").read_text())
    assert manifest["errors"] == {reason: 1}
    expected = {key: [r for r in rows if r["image_id"] != case["target"]] for key, rows in case["rows"].items()}
    assert rows_by_output(case["out"]) == expected


def test_bad_rows_above_the_error_budget_fail_the_build(case, capsys):
    """A negative box used to be a silent `empty_box` filter: now it counts against the budget."""
    _set_box([10, 10, -20, 20])(case)
    capsys.readouterr()
    assert build(case["root"], case["out"]) == 2  # 1 bad image is more than the default 5%
    line = _one_error_line(capsys.readouterr().err)
    n_images = sum(len(case["rows"][f"default/{split}"]) for split in SPLITS)
    assert f"1 of {n_images} items failed on bad input (bad_bbox: 1)" in line


def test_duplicate_image_error_names_both_entries(case, capsys):
    _duplicate_image("captions")(case)
    capsys.readouterr()
    assert build(case["root"], case["out"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"captions_{case['folder']}.json" in line and f"both have id {case['target']}" in line
    # Both entries are named by position and file name, so the user can find and fix them.
    data = json.loads((case["root"] / "annotations" / f"captions_{case['folder']}.json").read_text())
    positions = [i for i, e in enumerate(data["images"]) if e["id"] == case["target"]]
    assert f"images #{positions[0]} and #{positions[1]}" in line
    assert all(data["images"][i]["file_name"] in line for i in positions)


def test_decorrelation_counts_bad_rows_and_keeps_the_rest(clean, tmp_path, tiny_models_dir, nltk_data_dir):
    """The same reader policy in the decorrelation builder: a blank caption and a NaN box no
    longer slip into the ODmAP gallery or vanish as `empty_box`; every other row is unchanged."""

    def decorrelation(root: Path, out: Path) -> int:
        return cli_main(
            [
                "build",
                "decorrelation",
                "--coco-root",
                str(root),
                "--output",
                str(out),
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--fill",
                "zero",
                "--image-size",
                "64",
                "--part-size",
                "2",
                "--max-error-fraction",
                "0.9",
            ]
        )

    assert decorrelation(clean["root"], tmp_path / "clean") == 0
    root = tmp_path / "coco"
    shutil.copytree(clean["root"], root)
    case = {**clean, "root": root}
    _set_caption("  \n ")(case)
    karpathy = json.loads((root / "dataset_coco.json").read_text())["images"]
    other = next(e["cocoid"] for e in karpathy if e["split"] == "test" and e["cocoid"] != clean["target"])
    _set_box([1.0, 2.0, float("nan"), 4.0])(
        {**case, "target": other, "folder": next(e["filepath"] for e in karpathy if e["cocoid"] == other)}
    )
    assert decorrelation(root, tmp_path / "bad") == 0
    manifest = json.loads((tmp_path / "bad/build_manifest.json").read_text())
    assert manifest["errors"] == {"blank_caption": 1, "bad_bbox": 1}
    dropped = {clean["target"], other}
    before, after = rows_by_output(tmp_path / "clean"), rows_by_output(tmp_path / "bad")
    assert set(before) == set(after)
    for key in before:
        assert after[key] == [r for r in before[key] if r.get("image_id") not in dropped], key
    assert any(r["image_id"] in dropped for rows in before.values() for r in rows)


def test_repeated_ids_in_a_dataset_source_are_refused(tmp_path, tiny_models_dir, capsys):
    """`--dataset` with an `--id-column` that repeats a value: one line naming both rows."""
    import datasets

    source = tmp_path / "captions"
    source.mkdir()
    datasets.Dataset.from_dict(
        {"text": ["a dog on a sofa", "a cat on a mat", "a red bus"], "key": ["k0", "k1", "k0"]}
    ).to_parquet(str(source / "train.parquet"))
    capsys.readouterr()
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--stage",
                "captions",
                "--dataset",
                str(source),
                "--text-column",
                "text",
                "--id-column",
                "key",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--output",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    line = _one_error_line(capsys.readouterr().err)
    assert "work items #0 and #2 of the source both have id 'k0'" in line


def test_non_text_captions_in_a_dataset_source_are_counted_not_coerced(tmp_path, tiny_models_dir):
    """`--dataset` rows whose text is None, blank or a number: counted skips, never `'None'`."""
    import datasets

    source = tmp_path / "captions"
    source.mkdir()
    texts = ["a dog on a sofa", None, "   ", "a cat on a mat"]
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(source / "train.parquet"))
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--stage",
                "captions",
                "--dataset",
                str(source),
                "--text-column",
                "text",
                "--models",
                "tiny",
                "--max-error-fraction",
                "0.9",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--output",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    manifest = json.loads((tmp_path / "out/build_manifest.json").read_text())
    assert manifest["errors"] == {"bad_caption": 1, "blank_caption": 1}
    rows = [r for rs in rows_by_output(tmp_path / "out").values() for r in rs]
    assert {r["caption_0"] for r in rows} <= {"a dog on a sofa", "a cat on a mat"}


@pytest.fixture(scope="module")
def eccv_clean(tmp_path_factory) -> dict[str, Any]:
    """A COCO root of 4 real ECCV image queries (the fixture's ids are no test ids) and a clean
    eccv-positives build of it."""
    base = tmp_path_factory.mktemp("eccv_bad_inputs")
    images = sorted(random.Random(5).sample(sorted(package_json("eccv", "i2t")), 4))
    root = write_test_image_root(base / "coco", {i: [1] for i in images})
    assert eccv_build(root, base / "clean") == 0
    return {"root": root, "folder": "val2014", "target": images[1], "rows": rows_by_output(base / "clean")}


def eccv_build(root: Path, out: Path) -> int:
    return cli_main(["build", "eccv-positives", "--coco-root", str(root), "--output", str(out), "--part-size", "8192"])


@pytest.mark.parametrize(
    "mutate, reason",
    [
        pytest.param(_set_caption(None), "bad_caption", id="caption-null"),
        pytest.param(_set_caption(" "), "blank_caption", id="caption-whitespace"),
        pytest.param(_set_image("width", _DELETE), "bad_image_entry", id="image-without-width"),
        pytest.param(_set_box([10, 10, float("nan"), 20]), "bad_bbox", id="bbox-nan"),
    ],
)
def test_eccv_positives_counts_malformed_coco_records_and_never_stores_them(eccv_clean, tmp_path, mutate, reason):
    """A malformed record of the COCO root is counted once under the reader's reason and left out
    whole (builders/eccv_positives/METHOD.md §1): its image row is skipped, its captions' texts are null (as for a
    caption the root does not hold), its classes make no PM match; every other cell is as before."""
    root = tmp_path / "coco"
    shutil.copytree(eccv_clean["root"], root)
    target = eccv_clean["target"]
    mutate({**eccv_clean, "root": root})
    assert eccv_build(root, tmp_path / "out") == 0
    manifest = json.loads((tmp_path / "out/build_manifest.json").read_text())
    assert manifest["errors"] == {reason: 1}
    rows = rows_by_output(tmp_path / "out")
    texts = [r["caption"] for r in rows["t2i/test"]] + [t for r in rows["i2t/test"] for t in r["positive_captions"]]
    assert "" not in texts and " " not in texts

    own = set(package_json("coco", "i2t")[target])

    def expected(key: str, row: dict[str, Any]) -> dict[str, Any]:
        if key == "i2t/test":
            return {
                **row,
                "positive_captions": [
                    None if c in own else t
                    for c, t in zip(row["positive_caption_ids"], row["positive_captions"], strict=True)
                ],
            }
        return {**row, "caption": None} if key == "t2i/test" and row["caption_id"] in own else row

    for key in ("i2t/test", "t2i/test", "removed/test"):
        clean = [
            expected(key, r) for r in eccv_clean["rows"][key] if not (key == "i2t/test" and r["image_id"] == target)
        ]
        assert rows[key] == clean, key
    pm_images = {r["query_id"] for r in rows["pm/i2t"]} | {i for r in rows["pm/t2i"] for i in r["pm_positive_ids"]}
    assert target not in pm_images and pm_images
