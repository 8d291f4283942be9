"""`counterfactory show` on hostile datasets: an image cell holding only a `path` (to a file of the
user's, such as `/home/user/secret.jpg`) is never opened, neither by the thumbnailer nor by
`datasets` decoding a nested image column, from a local folder or from a Hub dataset; it is shown
as missing and counted. Image bytes that cannot be shown (truncated, undecodable, a decompression
bomb, an empty cell) are counted and shown as missing, never a traceback; an output that cannot
be written (disk full) is one line naming the path."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import struct
import sys
import zlib
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from helpers.gallery_helpers import one_error_line, page_records, show
from helpers.hostile_datasets import SHOWN_RGB, encoded, write_dataset

#: The secret's colour: no thumbnail of the gallery may come close to it.
SECRET_RGB = (13, 200, 77)

# ------------------------------------------------------------------ every file this process opens

_WATCHED: list[str] = []
_OPENED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    # Python's audit hook sees every open() of every thread (PIL, datasets' decoding pool).
    if event == "open" and _WATCHED and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if any(path == w or path.startswith(w + os.sep) for w in _WATCHED):
            _OPENED.append(path)


sys.addaudithook(_audit)


@pytest.fixture
def opened():
    """Paths opened under the folders passed to `watch(folder)` while the test runs."""

    class Recorder:
        paths = _OPENED

        @staticmethod
        def watch(folder: Path) -> None:
            _WATCHED.append(str(folder.resolve()))

    yield Recorder
    _WATCHED.clear()
    _OPENED.clear()


# ------------------------------------------------------------------ hostile datasets


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims width x height pixels (a decompression bomb's header)."""
    data = bytearray(encoded((0, 0, 0), "PNG", (8, 8)))
    data[16:24] = struct.pack(">II", width, height)  # IHDR width, height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR checksum
    return bytes(data)


def path_only_dataset(folder: Path, secret: Path) -> Path:
    shown = encoded(SHOWN_RGB)
    only_path = {"bytes": None, "path": str(secret)}
    return write_dataset(
        folder,
        [
            {"image": {"bytes": shown, "path": None}, "extras": [], "caption": "a red square"},
            {"image": only_path, "extras": [only_path], "caption": "absolute path to the secret"},
            # Relative to the working folder, which the test makes the secret's.
            {"image": {"bytes": None, "path": secret.name}, "extras": [], "caption": "relative path"},
            # Bytes win: the path next to them is not read either.
            {"image": {"bytes": shown, "path": str(secret)}, "extras": [only_path], "caption": "both"},
        ],
    )


def mean_rgb(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=float).reshape(-1, 3).mean(axis=0)


def assert_secret_never_read(out: Path, secret: Path, opened) -> None:
    assert opened.paths == [], "show opened the file a path-only cell names"
    records = page_records(out)
    assert [r["texts"][0]["segs"][0][0] for r in records] == [
        "a red square",
        "absolute path to the secret",
        "relative path",
        "both",
    ]
    for k in (0, 3):
        (im,) = records[k]["imgs"]
        assert np.abs(mean_rgb(out / im["src"]) - SHOWN_RGB).max() < 12, im
    for k in (1, 2):
        assert records[k]["imgs"] == [{"label": "image", "missing": "path_only"}], records[k]
    secret_bytes = secret.read_bytes()
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert secret_bytes not in path.read_bytes(), path
        if path.suffix == ".jpg":
            assert np.abs(mean_rgb(path) - SECRET_RGB).max() > 60, path
    summary = json.loads((out / "gallery.json").read_text())
    assert summary["images_not_shown"] == {"path_only": 2}
    stats = (out / "stats.html").read_text()
    assert "<tr><td>path_only</td><td>2</td><td>1, 2</td></tr>" in stats


@pytest.fixture
def secret(tmp_path, monkeypatch) -> Path:
    """A real JPEG of the user's, outside every dataset; the working folder is its folder."""
    home = tmp_path / "home" / "user"
    home.mkdir(parents=True)
    path = home / "secret.jpg"
    path.write_bytes(encoded(SECRET_RGB))
    monkeypatch.chdir(home)
    return path


def test_a_path_only_cell_of_a_local_folder_is_never_opened(tmp_path, secret, opened, capsys):
    build = path_only_dataset(tmp_path / "dataset", secret)
    out = tmp_path / "gallery"
    opened.watch(secret.parent)
    assert show(build, "--output", out) == 0
    assert_secret_never_read(out, secret, opened)
    printed = capsys.readouterr().out
    assert "2 images not shown (path_only 2; see stats.html)" in printed, printed


def test_a_path_only_cell_of_a_hub_dataset_is_never_opened(tmp_path, secret, opened, local_hub):
    from huggingface_hub import HfApi

    repo = "someone/path-only-images"
    api = HfApi()
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    api.upload_folder(
        folder_path=str(path_only_dataset(tmp_path / "dataset", secret)), repo_id=repo, repo_type="dataset"
    )
    out = tmp_path / "gallery"
    opened.watch(secret.parent)
    assert show(repo, "--output", out) == 0
    assert_secret_never_read(out, secret, opened)


def test_images_that_cannot_be_shown_are_counted_and_shown_as_missing(tmp_path, capsys):
    good = encoded(SHOWN_RGB)
    problems = [
        (good[: len(good) // 2], "truncated"),
        (b"these bytes are not an image", "undecodable"),
        (png_claiming(30_000, 30_000), "too_many_pixels"),  # PIL's DecompressionBombError
        (png_claiming(10_000, 10_000), "too_many_pixels"),  # only PIL's warning: would decode
        (None, "empty"),
    ]
    rows = [{"image": {"bytes": good, "path": None}, "extras": [], "caption": "fine"}]
    rows += [{"image": {"bytes": data, "path": None}, "extras": [], "caption": reason} for data, reason in problems]
    rows.append({"image": None, "extras": [], "caption": "no image (an optional column)"})
    build = write_dataset(tmp_path / "dataset", rows)
    out = tmp_path / "gallery"
    capsys.readouterr()
    assert show(build, "--output", out) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    records = page_records(out)
    assert len(records) == len(rows)
    (im,) = records[0]["imgs"]
    assert np.abs(mean_rgb(out / im["src"]) - SHOWN_RGB).max() < 12
    for rec, (data, reason) in zip(records[1:-1], problems, strict=True):
        # Bytes that cannot be read fully may hide a GPS position: flagged as unknown (issue 49);
        # the PNGs claiming too many pixels are whole files without metadata.
        gps = {"gps": "unknown"} if reason in ("truncated", "undecodable") else {}
        assert rec["imgs"] == [{"label": "image", "missing": reason, **gps}], rec
    assert records[-1]["imgs"] == []  # nothing to show, nothing wrong
    expected = {"too_many_pixels": 2, "empty": 1, "truncated": 1, "undecodable": 1}
    marker = json.loads((out / "gallery.json").read_text())
    assert marker["images_not_shown"] == expected
    assert (marker["images_with_gps"], marker["images_gps_unknown"]) == (2, 2)
    assert (
        "5 images not shown (too_many_pixels 2, empty 1, truncated 1, undecodable 1; see stats.html)" in captured.out
    )
    stats = (out / "stats.html").read_text()
    assert "<tr><td>too_many_pixels</td><td>2</td><td>3, 4</td></tr>" in stats
    assert "<tr><td>undecodable</td><td>1</td><td>2</td></tr>" in stats


@pytest.mark.parametrize("failing", ["thumbs/", "pages/", "stats/", "index.html", "gallery.json"])
def test_a_full_disk_is_one_line_naming_the_output(tmp_path, capsys, monkeypatch, failing):
    # A skip reason is a facet: the stats page charts it (stats/*.png).
    features = datasets.Features(
        {"image": datasets.Image(), "caption": datasets.Value("string"), "skip_reason": datasets.Value("string")}
    )
    build = write_dataset(
        tmp_path / "dataset",
        [{"image": {"bytes": encoded(SHOWN_RGB), "path": None}, "caption": "a", "skip_reason": "none"}],
        features,
    )
    out = tmp_path / "gallery"
    target = str(out) + os.sep + failing
    real_open, real_io_open = builtins.open, io.open

    def full(real):
        def opener(file, mode="r", *args, **kwargs):
            name = os.fsdecode(file) if isinstance(file, (str, bytes, os.PathLike)) else ""
            # The marker is written once at the start (a rerun may then replace the folder):
            # fail its final write, as a disk that filled up during the run would.
            if (
                "w" in mode
                and name.startswith(target)
                and (failing != "gallery.json" or (out / "index.html").exists())
            ):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(file, mode, *args, **kwargs)

        return opener

    monkeypatch.setattr(builtins, "open", full(real_open))
    monkeypatch.setattr(io, "open", full(real_io_open))
    err = one_error_line(capsys, [build, "--output", out], str(out), "No space left on device")
    assert "cannot write the gallery" in err


def test_a_failing_read_is_one_line_naming_the_source_not_a_write_error(tmp_path, capsys, monkeypatch):
    build = write_dataset(
        tmp_path / "dataset", [{"image": {"bytes": encoded(SHOWN_RGB), "path": None}, "extras": [], "caption": "a"}]
    )
    real_open, real_io_open = builtins.open, io.open

    def failing(real):
        def opener(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.fspath(file).endswith(".parquet"):
                raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(file))
            return real(file, mode, *args, **kwargs)

        return opener

    monkeypatch.setattr(builtins, "open", failing(real_open))
    monkeypatch.setattr(io, "open", failing(real_io_open))
    err = one_error_line(
        capsys,
        [build, "--output", tmp_path / "gallery"],
        str(build),
        "cannot read the rows of default/test",
        "Input/output error",
    )
    assert "cannot write" not in err


@pytest.mark.parametrize(
    "view",
    [
        "not a view",
        [1, 2],
        {"slots": []},
        {"name": "x", "slots": [{"column": "image", "bogus": 1}]},
        {"name": "x", "texts": [{"column": "caption", "label": "c", "style": "<script>"}]},
        {"name": "x", "facets": [{"name": "f"}]},
    ],
)
def test_a_manifest_view_that_does_not_parse_falls_back_to_the_generic_view(tmp_path, view, caplog):
    """Someone else's build manifest may declare any `view`: `show` warns and shows the rows."""
    folder = write_dataset(
        tmp_path / "dataset",
        [{"image": {"bytes": encoded(SHOWN_RGB), "path": None}, "extras": [], "caption": "a cat"}],
    )
    (folder / "build_manifest.json").write_text(
        json.dumps({"outputs": {"default/test": {"config": "default", "split": "test", "view": view}}})
    )
    out = tmp_path / "gallery"
    with caplog.at_level("WARNING", logger="builders.viewer.row_view"):
        assert show(folder, "--output", out) == 0
    assert "declares a view that does not parse" in caplog.text
    assert json.loads((out / "gallery.json").read_text())["kind"] == "generic"
    assert len(page_records(out)) == 1


def test_a_grouped_row_whose_lists_differ_in_length_is_shown_as_such():
    from builders.eccv_positives.view import I2T_VIEW as VIEW
    from builders.viewer.rows import texts

    # A published eccv-positives-shaped row whose lists were cut: one source short.
    row = {
        "positive_captions": ["a dog", "a cat", "<b>x</b>"],
        "positive_caption_ids": [1, 2, 3],
        "positive_sources": ["coco", "eccv"],
    }
    blocks = [b for b in texts(VIEW, row) if b["label"] == "positives"]
    assert blocks and "3 texts, 3 ids and 2 groups: lists of different lengths" in str(blocks[0]["segs"])
