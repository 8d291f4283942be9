"""`build coco-counterfactuals --captions-from PAIRS --images-from DIR|ZIP` (issue 33): the image
pairs that exist (the published release) are imported instead of generated, from a folder in the
paper's evaluation layout, from a zip in the Hub release's layout (read in place), from `{id}_N`
files and from a pattern. Rows keep the published ids and the images' bytes; ids without both
images, broken images and names leading outside the root are counted skips (nothing outside is
ever opened); the CLIP filter scores are the generation path's and drop pairs only with
`--apply-filters`; the card names the source by file name and sha256 under CC BY 4.0; the build
publishes to the local Hub and loads with plain `load_dataset` where counterfactory is not
installed."""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import re
import stat
import subprocess
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from builders.app.cli import main as cli_main
from builders.counterfactuals.images import score_pairs
from builders.counterfactuals.view import PAIR_VIEW
from builders.models.clip import load_scorer
from builders.models.profiles import resolve_profile

from helpers.build_helpers import error_line
from helpers.gallery_helpers import show

# The cached clean virtualenv (no counterfactory, no torch; `evaluate` brings `datasets`).
from metrics.test_metric_spaces_clean_venv import clean_python  # noqa: F401  (a fixture)

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

#: (id, caption_0, caption_1, what the sources hold for it). Ids are not in order and are not row
#: indices, so a build that renumbered or sorted rows would show.
ROWS = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach.", "pair"),
    ("x3", "A cat on a red mat.", "A dog on a red mat.", "image 0 only"),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch.", "pair"),
    ("x4", "A bowl of fruit on a table.", "A bowl of soup on a table.", "nothing"),
    ("x5", "A bus on the street.", "A truck on the street.", "image 0 hostile"),
    ("../outside/x6", "A boy with a kite.", "A girl with a kite.", "id climbs out"),
    ("b8", "A plate of pasta.", "A plate of rice.", "image 0 broken"),
]
GOOD = ["A17", "9"]
#: The counted skips every layout gives (a hostile image 0 adds its own reason per layout).
SKIPS = {"no_imported_images": 1}
ERRORS = {"missing_image": 1, "path_outside_root": 1, "unreadable_image": 1}
TINY = ["--models", "tiny", "--part-size", "2", "--max-error-fraction", "1"]


def jpeg(seed: int, size: int = 48) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png_rgba(seed: int, size: int = 40) -> bytes:
    """A non-RGB image (RGBA): stored as it is, converted only for CLIP."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 4), dtype=np.uint8), "RGBA").save(buf, "PNG")
    return buf.getvalue()


def images_of(row_id: str, what: str) -> dict[int, bytes]:
    """The bytes of the images a source holds for `row_id` (index: 0 or 1)."""
    seed = sum(map(ord, row_id))
    if what in ("pair", "image 0 hostile"):
        return {0: jpeg(seed), 1: jpeg(seed + 1)} if what == "pair" else {1: jpeg(seed + 1)}
    if what == "image 0 only":
        return {0: jpeg(seed)}
    if what == "image 0 broken":
        return {0: jpeg(seed)[:200], 1: jpeg(seed + 1)}  # truncated: no decodable JPEG
    return {}


def write_tsv(path: Path) -> Path:
    path.write_text("".join(f"{i}\t{c0}\t{c1}\n" for i, c0, c1, _ in ROWS), encoding="utf-8")
    return path


def write_jsonl(path: Path) -> Path:
    """The published .jsonl keys; `image_0` cells name a file outside, which is never opened."""
    path.write_text(
        "".join(
            json.dumps(
                {
                    "coco-counterfactual-index": i,
                    "original_caption": c0,
                    "counterfactual_caption": c1,
                    "image_0": "/etc/passwd",
                }
            )
            + "\n"
            for i, c0, c1, _ in ROWS
        ),
        encoding="utf-8",
    )
    return path


def outside_secret(base: Path) -> Path:
    """A valid image outside every root, under the names a hostile id or link leads to."""
    outside = base / "outside"
    outside.mkdir(exist_ok=True)
    for name in ("secret.jpg", "x6.jpg", "x6_0.jpg", "x6_1.jpg", "x6_img_0.jpg", "x6_img_1.jpg"):
        (outside / name).write_bytes(jpeg(999))
    return outside


def folders_fixture(base: Path) -> Path:
    """The paper's evaluation layout in a folder, at its top; 9's image 0 is a .png (the layouts
    look for .jpg, then .png); x5's image 0 is a symlink to an image outside the folder."""
    root = base / "cf-images"
    folders = [root / "synthetic-images-for-original-captions", root / "synthetic-images-for-counterfactual-captions"]
    for folder in folders:
        folder.mkdir(parents=True)
    for row_id, _, _, what in ROWS:
        for n, data in images_of(row_id, what).items():
            ext = ".png" if (row_id, n) == ("9", 0) else ".jpg"
            (folders[n] / f"{row_id}{ext}").write_bytes(png_rgba(7) if ext == ".png" else data)
    (folders[0] / "x5.jpg").symlink_to(outside_secret(base) / "secret.jpg")
    return root


def release_zip(base: Path) -> Path:
    """The Hub release's layout (`images/{id}_img_{n}.jpg`, one top-level folder) in a zip, with
    x5's image 0 only as members that are never read: a `..` name, an absolute name, a symlink
    member and a name held twice."""
    path = base / "images.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for row_id, _, _, what in ROWS:
            for n, data in images_of(row_id, what).items():
                zf.writestr(f"images/{row_id}_img_{n}.jpg", data)
        zf.writestr("images/../images/x5_img_0.jpg", jpeg(1))
        zf.writestr("/images/x5_img_0.jpg", jpeg(2))
        link = zipfile.ZipInfo("images/x5_img_0.jpg")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("images/twice_img_0.jpg", jpeg(3))
            zf.writestr("images/twice_img_0.jpg", jpeg(4))
    return path


def numbered_fixture(base: Path) -> Path:
    """`{id}_0.jpg` / `{id}_1.jpg` under one top-level folder (as an unzipped archive), beside a
    README; x5's image 0 is a symlink out."""
    root = base / "unzipped"
    folder = root / "coco-cf"
    folder.mkdir(parents=True)
    (root / "README.txt").write_text("the release's images\n")
    for row_id, _, _, what in ROWS:
        for n, data in images_of(row_id, what).items():
            (folder / f"{row_id}_{n}.jpg").write_bytes(data)
    (folder / "x5_0.jpg").symlink_to(outside_secret(base) / "secret.jpg")
    return root


def build(out: Path, tiny: Path, captions: Path, images: Path, *extra: str) -> dict:
    argv = [
        "build",
        "coco-counterfactuals",
        "--captions-from",
        str(captions),
        "--images-from",
        str(images),
        "--tiny-models-dir",
        str(tiny),
        "--output",
        str(out),
        *TINY,
        *extra,
    ]
    assert cli_main(argv) == 0
    return json.loads((out / "build_manifest.json").read_text())


def shard_rows(out: Path) -> list[dict]:
    manifest = json.loads((out / "build_manifest.json").read_text())
    return [
        row
        for shard in manifest["outputs"]["default/test"]["shards"]
        for row in pq.read_table(out / shard).to_pylist()
    ]


class Opened:
    """Every path the process opens, stats or lists, and every zip member it opens."""

    def __init__(self, monkeypatch) -> None:
        self.paths: list[str] = []
        self.members: list[str] = []
        for module, name in (
            (os, "open"),
            (os, "stat"),
            (os, "lstat"),
            (os, "scandir"),
            (os, "readlink"),
            (builtins, "open"),
        ):
            monkeypatch.setattr(module, name, self._recording(getattr(module, name)))
        zip_open = zipfile.ZipFile.open

        def member(zf, name, *args, **kwargs):
            self.members.append(name.orig_filename if isinstance(name, zipfile.ZipInfo) else name)
            return zip_open(zf, name, *args, **kwargs)

        monkeypatch.setattr(zipfile.ZipFile, "open", member)

    def _recording(self, real):
        def wrapper(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)):
                self.paths.append(os.fspath(path))
            return real(path, *args, **kwargs)

        return wrapper

    def under(self, folder: Path) -> list[str]:
        return [p for p in self.paths if os.path.abspath(p).startswith(str(folder))]


def check_rows(
    out: Path,
    manifest: dict,
    expected_images: dict[str, tuple[bytes, bytes]],
    errors: dict[str, int],
    scored: bool = True,
) -> list[dict]:
    """The published ids in table order, the images' bytes as the source holds them, the
    captions and the swap located in them, the scores, and the counted skips."""
    rows = shard_rows(out)
    assert [r["id"] for r in rows] == GOOD
    by_id = {r[0]: r for r in ROWS}
    for r in rows:
        assert (r["image_0"]["bytes"], r["image_1"]["bytes"]) == expected_images[r["id"]], r["id"]
        assert r["image_0"]["path"] is None and r["image_1"]["path"] is None
        assert (r["caption_0"], r["caption_1"]) == by_id[r["id"]][1:3] and r["source_id"] == r["id"]
        assert r["caption_0"][r["replaced_position"] :].startswith(r["replaced_word"])
        scores = [r[c] for c in ("clip_score_0", "clip_score_1", "clip_directional", "clip_image_similarity")]
        assert all(isinstance(v, float) for v in scores) if scored else scores == [None] * 4
        assert r["seed"] is None and r["sd_model"] is None
        assert r["clip_model"].startswith("local:clip") if scored else r["clip_model"] is None
    assert manifest["skipped"] == SKIPS and manifest["errors"] == errors
    assert manifest["counts"].get("imported_pairs_scored") == (len(GOOD) if scored else None)
    return rows


def source_bytes(root: Path, names: dict[str, tuple[str, str]]) -> dict[str, tuple[bytes, bytes]]:
    return {i: ((root / a).read_bytes(), (root / b).read_bytes()) for i, (a, b) in names.items()}


def folder_sha256(root: Path) -> str:
    """The folder digest the card names (builders/counterfactuals/METHOD.md §2): sha256 over `<file sha256>  <name>`
    lines, files of a folder by name before its sub-folders, symlinks by their link text."""
    h = hashlib.sha256()
    for folder, dirs, names in os.walk(root):
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = sorted(set(dirs) - set(links))
        for name in sorted(names + links):
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                h.update(f"-> {os.readlink(path)}  {rel}\n".encode())
            else:
                h.update(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {rel}\n".encode())
    return h.hexdigest()


def test_folder_in_the_papers_layout(tmp_path, tiny_models_dir, nltk_data_dir, monkeypatch):
    root = folders_fixture(tmp_path)
    captions = write_tsv(tmp_path / "pairs.tsv")
    opened = Opened(monkeypatch)
    manifest = build(tmp_path / "out", tiny_models_dir, captions, root)
    monkeypatch.undo()
    original, counterfactual = (
        "synthetic-images-for-original-captions",
        "synthetic-images-for-counterfactual-captions",
    )
    check_rows(
        tmp_path / "out",
        manifest,
        source_bytes(
            root,
            {
                "A17": (f"{original}/A17.jpg", f"{counterfactual}/A17.jpg"),
                "9": (f"{original}/9.png", f"{counterfactual}/9.jpg"),
            },
        ),
        {**ERRORS, "path_outside_root": 2},
    )
    # The symlink out of the folder and the id that climbs out: never opened, stat'ed or listed.
    assert opened.under(tmp_path / "outside") == []
    source = manifest["config"]["images_source"]
    assert source == {
        "kind": "folder",
        "name": "cf-images",
        "sha256": folder_sha256(root),
        "files": 8,
        "layout": "folders",
        "names": f"{original}/{{id}}.jpg and {counterfactual}/{{id}}.jpg",
    }
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"the folder `cf-images` (sha256\n`{source['sha256']}`" in card
    assert str(tmp_path) not in card and str(tmp_path) not in json.dumps(manifest)


def test_zip_in_the_release_layout(tmp_path, tiny_models_dir, nltk_data_dir, monkeypatch):
    path = release_zip(tmp_path)
    captions = write_jsonl(tmp_path / "pairs.jsonl")
    opened = Opened(monkeypatch)
    manifest = build(tmp_path / "out", tiny_models_dir, captions, path)
    monkeypatch.undo()
    with zipfile.ZipFile(path) as zf:
        expected = {i: (zf.read(f"images/{i}_img_0.jpg"), zf.read(f"images/{i}_img_1.jpg")) for i in GOOD}
    # x5's image 0 exists only as members that are never read: x5 lacks an image.
    check_rows(tmp_path / "out", manifest, expected, {**ERRORS, "missing_image": 2})
    never = {"images/../images/x5_img_0.jpg", "/images/x5_img_0.jpg", "images/x5_img_0.jpg", "images/twice_img_0.jpg"}
    assert opened.members and not never & set(opened.members), opened.members
    assert not [p for p in opened.paths if p in ("/etc/passwd", "/images/x5_img_0.jpg")]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["config"]["images_source"] == {
        "kind": "zip",
        "name": "images.zip",
        "sha256": digest,
        "members": 8,
        "ignored_members": {"duplicate_name": 2, "symlink": 1, "unsafe_name": 2},
        "layout": "release",
        "names": "images/{id}_img_0.jpg and images/{id}_img_1.jpg",
    }
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"the zip `images.zip` (sha256\n`{digest}`)" in card
    assert "distributed under **CC BY 4.0**" in card and "license: cc-by-4.0" in card
    assert "duplicate_name: 2, symlink: 1, unsafe_name: 2" in card
    assert "| no_imported_images | filtered by the method | 1 |" in card
    assert "| missing_image | input error | 2 |" in card
    assert str(tmp_path) not in card and str(tmp_path) not in json.dumps(manifest)


def test_numbered_files_and_a_pattern(tmp_path, tiny_models_dir, nltk_data_dir, monkeypatch):
    root = numbered_fixture(tmp_path)
    captions = write_tsv(tmp_path / "pairs.tsv")
    opened = Opened(monkeypatch)
    manifest = build(tmp_path / "out", tiny_models_dir, captions, root)
    monkeypatch.undo()
    names = {i: (f"coco-cf/{i}_0.jpg", f"coco-cf/{i}_1.jpg") for i in GOOD}
    check_rows(tmp_path / "out", manifest, source_bytes(root, names), {**ERRORS, "path_outside_root": 2})
    assert opened.under(tmp_path / "outside") == []
    assert manifest["config"]["images_source"]["layout"] == "numbered"
    assert manifest["config"]["images_source"]["names"] == "coco-cf/{id}_0.jpg and coco-cf/{id}_1.jpg"
    # The same files named by a pattern (relative to the root: no folder is detected), imported
    # without the CLIP model.
    manifest = build(
        tmp_path / "pattern",
        tiny_models_dir,
        captions,
        root,
        "--images-pattern",
        "coco-cf/{id}_{n}.jpg",
        "--no-clip-scores",
    )
    check_rows(
        tmp_path / "pattern", manifest, source_bytes(root, names), {**ERRORS, "path_outside_root": 2}, scored=False
    )
    assert manifest["config"]["images_source"]["layout"] == "pattern" and manifest["models"] == {}
    assert "Not computed (`--no-clip-scores`)" in (tmp_path / "pattern" / "README.md").read_text()


def test_layouts_that_cannot_be_told_or_found_are_one_line(tmp_path, capsys):
    root = folders_fixture(tmp_path)
    captions = write_tsv(tmp_path / "pairs.tsv")

    def fails(*extra: str, images: Path = root) -> str:
        capsys.readouterr()
        out = tmp_path / "out"
        argv = [
            "build",
            "coco-counterfactuals",
            "--captions-from",
            str(captions),
            "--output",
            str(out),
            "--models",
            "tiny",
            *(["--images-from", str(images)] if images else []),
            *extra,
        ]
        assert cli_main(argv) == 2
        # Nothing built: at most the folder's lock, taken before the inputs are read.
        assert not [p for p in out.rglob("*") if p.name not in (".parts", "lock")] if out.exists() else True
        return error_line(capsys)

    (root / "A17_0.jpg").write_bytes(jpeg(5))  # a numbered file beside the paper's folders
    line = fails()
    assert "cf-images: holds images of several layouts (folders, numbered)" in line and "--images-layout" in line
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--captions-from",
                str(captions),
                "--images-from",
                str(root),
                "--images-layout",
                "folders",
                "--output",
                str(tmp_path / "ok"),
                "--models",
                "tiny",
                "--max-error-fraction",
                "1",
            ]
        )
        == 0
    )
    empty = tmp_path / "empty"
    (empty / "a" / "b").mkdir(parents=True)
    assert "holds no image of a known layout" in fails(images=empty)
    assert "holds no image named as the release layout says" in fails("--images-layout", "release")
    # Files named by a pattern that matches no id: the wrong layout, not 7 counted skips.
    assert "none of the 7 caption pairs has an image" in fails("--images-pattern", "{id}-{n}.webp")
    assert "--images-pattern: '../{id}_{n}.jpg' is not a name pattern" in fails("--images-pattern", "../{id}_{n}.jpg")
    assert "'{id}.jpg' is not a name pattern" in fails("--images-pattern", "{id}.jpg")
    # An explicit layout is also looked for under the one top-level folder when the top holds
    # another one (auto takes the top's).
    from builders.counterfactuals.image_sources import FolderSource, detect_layout

    wrapped = tmp_path / "wrapped"
    (wrapped / "images").mkdir(parents=True)
    (wrapped / "cover_0.jpg").write_bytes(jpeg(1))
    (wrapped / "images" / "A17_img_0.jpg").write_bytes(jpeg(2))
    assert detect_layout(FolderSource(wrapped, 1 << 20), "release").names("A17", 0)[0] == "images/A17_img_0.jpg"
    assert detect_layout(FolderSource(wrapped, 1 << 20), "auto").name == "numbered"
    assert "neither a folder nor a zip file" in fails(images=captions)
    assert "--apply-filters needs the CLIP scores" in fails("--apply-filters", "--no-clip-scores")
    assert "it goes with --stage images (or no --stage), not --stage all" in fails("--stage", "all")
    assert "--images-pattern only apply to --images-from" in fails("--images-pattern", "{id}_{n}.jpg", images=None)


def test_scores_are_the_generation_paths_and_drop_pairs_only_with_the_flag(tmp_path, tiny_models_dir, nltk_data_dir):
    path = release_zip(tmp_path)
    captions = write_tsv(tmp_path / "pairs.tsv")
    build(tmp_path / "all", tiny_models_dir, captions, path)
    rows = shard_rows(tmp_path / "all")
    scorer = load_scorer(resolve_profile("tiny", tiny_models_dir).clip_filter)
    for r in rows:
        images = [np.array(Image.open(io.BytesIO(r[c]["bytes"])).convert("RGB")) for c in ("image_0", "image_1")]
        s = score_pairs(scorer, r["caption_0"], r["caption_1"], images[0][None], images[1][None])
        assert [
            r["clip_score_0"],
            r["clip_score_1"],
            r["clip_directional"],
            r["clip_image_similarity"],
        ] == pytest.approx(
            [s.clip_0.item(), s.clip_1.item(), s.directional.item(), s.image_similarity.item()], abs=1e-5
        )
    # A directional threshold between the two pairs' scores: only --apply-filters drops the lower.
    low, high = sorted(r["clip_directional"] for r in rows)
    threshold = str((low + high) / 2)
    manifest = build(
        tmp_path / "kept",
        tiny_models_dir,
        captions,
        path,
        "--filters",
        "directional",
        "--directional-threshold",
        threshold,
    )
    assert [r["id"] for r in shard_rows(tmp_path / "kept")] == GOOD
    manifest = build(
        tmp_path / "filtered",
        tiny_models_dir,
        captions,
        path,
        "--filters",
        "directional",
        "--directional-threshold",
        threshold,
        "--apply-filters",
    )
    assert [r["id"] for r in shard_rows(tmp_path / "filtered")] == [
        r["id"] for r in rows if r["clip_directional"] == high
    ]
    assert manifest["skipped"] == {**SKIPS, "imported_pair_failed_clip": 1}
    assert manifest["counts"]["image_rejected_directional"] == 1
    card = (tmp_path / "filtered" / "README.md").read_text()
    assert re.search(rf"\| `directional` \| .* \| {re.escape(threshold)} \| yes \| 1 \|", card)


def test_work_items_open_no_image_and_the_gallery_shows_the_scores(
    tmp_path, tiny_models_dir, nltk_data_dir, monkeypatch
):
    from builders.counterfactuals.builder import CocoCounterfactualsBuilder
    from builders.counterfactuals.config import CocoCounterfactualsConfig, ImageImportConfig

    path = release_zip(tmp_path)
    captions = write_tsv(tmp_path / "pairs.tsv")
    builder = CocoCounterfactualsBuilder(
        CocoCounterfactualsConfig(
            stage="images", captions_from=str(captions), image_import=ImageImportConfig(str(path))
        )
    )
    opened = Opened(monkeypatch)
    items = list(builder.work_items())
    monkeypatch.undo()
    # Names, sizes and CRCs: the images are read part by part, when a part is built.
    assert len(items) == len(ROWS) and opened.members == []
    assert items[0].images[0].crc == zipfile.ZipFile(path).getinfo("images/A17_img_0.jpg").CRC

    out = tmp_path / "out"
    build(out, tiny_models_dir, captions, path)
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["outputs"]["default/test"]["view"] == json.loads(json.dumps(PAIR_VIEW.to_dict()))
    figures = [f["path"] for f in manifest["card_figures"]]
    assert figures == ["figures/examples.png"] + [
        f"figures/hist_{c}.png" for c in ("clip_score_0", "clip_score_1", "clip_directional", "clip_image_similarity")
    ]
    assert show(out, "--output", tmp_path / "gallery") == 0
    summary = json.loads((tmp_path / "gallery" / "gallery.json").read_text())
    assert summary["complete"] and summary["rows"] == len(GOOD)


#: Run by the clean virtualenv's interpreter: the published pairs through plain `load_dataset`.
CLEAN_LOAD = textwrap.dedent("""
    import hashlib, importlib.util, json, sys
    import datasets
    from datasets import load_dataset
    ds = load_dataset(sys.argv[1], revision="v1.0.0", split="test")
    raw = ds.cast_column("image_0", datasets.Image(decode=False)).cast_column(
        "image_1", datasets.Image(decode=False))
    print(json.dumps({
        "datasets": datasets.__version__,
        "project": [m for m in ("builders", "counterfactory") if importlib.util.find_spec(m)],
        "rows": [[r["id"], r["caption_0"], r["caption_1"],
                  hashlib.sha256(r["image_0"]["bytes"]).hexdigest(),
                  hashlib.sha256(r["image_1"]["bytes"]).hexdigest()] for r in raw],
        "decoded": list(ds[0]["image_0"].size),
        "columns": ds.column_names[:5],
    }))
""")


def test_published_import_loads_where_counterfactory_is_not_installed(
    tmp_path,
    tiny_models_dir,
    nltk_data_dir,
    repo_id,
    clean_python,  # noqa: F811
):
    path = release_zip(tmp_path)
    out = tmp_path / "out"
    build(out, tiny_models_dir, write_jsonl(tmp_path / "pairs.jsonl"), path)
    # Its own repo: the local Hub lives as long as the test worker, which may run
    # test_coco_counterfactuals_build.py's v1.0.0 of tester/coco-counterfactuals too.
    repo = repo_id
    assert cli_main(["publish", str(out), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "load.py").write_text(CLEAN_LOAD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"))
    proc = subprocess.run(
        [str(clean_python), "load.py", repo],
        cwd=tmp_path / "run",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["project"] == [] and int(got["datasets"].split(".")[0]) >= 4, got
    with zipfile.ZipFile(path) as zf:
        expected = [
            [i, c0, c1, *(hashlib.sha256(zf.read(f"images/{i}_img_{n}.jpg")).hexdigest() for n in (0, 1))]
            for i, c0, c1, _ in ROWS
            if i in GOOD
        ]
    assert got["rows"] == expected
    assert got["columns"] == ["id", "image_0", "image_1", "caption_0", "caption_1"]
    assert got["decoded"] == [48, 48]
