"""`counterfactory show`: the gallery written from real (tiny) builds holds every row in order, with
thumbnails that depict the row's images, the swapped word highlighted where the captions differ,
the removed words struck through, the mask outlined; a published version at a tag gives the same
gallery; bad input is one line each. The browser test drives these galleries
(test_gallery_browser.py); the card figures are checked in test_gallery_cards.py."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset
from PIL import Image

from builders.app.cli import main as cli_main
from builders.viewer.rows import KEY_PROVENANCE, PROVENANCE_ORDER
from helpers.gallery_helpers import fixture_build, one_error_line, only_split, page_records, show, text_of

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def span(segs: list, style: str) -> tuple[int, str]:
    """(start offset, text) of the only segment with `style`."""
    marked = [(k, s) for k, s in enumerate(segs) if s[1] == style]
    assert len(marked) == 1, segs
    k, seg = marked[0]
    return len(text_of(segs[:k])), seg[0]


def assert_provenance_shown(rec: dict, row: dict) -> list[str]:
    """Every provenance column of the row with a value is in the record's details with that value,
    and the key ones also on the card itself; a null one is not shown. Returns the shown names."""
    details, card = dict(rec["meta"]), dict(rec["key"])
    shown = []
    for name in (n for n in PROVENANCE_ORDER if n in row):
        value = row[name]
        if value is None:
            assert name not in details, (name, details[name])
            continue
        assert (name in card) == (name in KEY_PROVENANCE) and name in details, (name, rec["key"])
        if name in card:
            assert card[name] == details[name]
        if isinstance(value, float):
            if math.isnan(value):
                assert details[name] == "nan"
            else:
                assert float(details[name]) == pytest.approx(value, rel=1e-3), (name, details[name])
        else:
            assert details[name] == str(value), (name, details[name], value)
        shown.append(name)
    return shown


def assert_depicts(
    thumb_path: Path, original: Image.Image, other: Image.Image | None = None, max_side: int = 160
) -> None:
    """The thumbnail has the original's aspect ratio, is never enlarged, and looks like the
    original (JPEG of the tiny models' noise images is lossy: closer to it than to `other`)."""
    thumb = Image.open(thumb_path).convert("RGB")
    w, h = original.size
    scale = min(1.0, max_side / max(w, h))
    assert abs(thumb.width - w * scale) <= 1 and abs(thumb.height - h * scale) <= 1, (thumb.size, original.size)

    def error(image: Image.Image) -> float:
        reference = np.asarray(image.convert("RGB").resize(thumb.size, Image.Resampling.BICUBIC), dtype=float)
        return float(np.abs(np.asarray(thumb, dtype=float) - reference).mean())

    own = error(original)
    assert own < 40, (thumb_path, own)
    if other is not None:
        assert own < 0.75 * error(other), (thumb_path, own, error(other))


@pytest.fixture(scope="module")
def builds(session_tmp, coco_fixture_dir, tiny_models_dir, nltk_data_dir):
    return lambda name: fixture_build(name, session_tmp, coco_fixture_dir, tiny_models_dir)


def test_counterfactual_gallery_has_every_row_with_the_swap_highlighted(builds, tmp_path):
    build = builds("coco-counterfactuals")
    out = tmp_path / "gallery"
    assert show(build, "--output", out, "--page-size", "3") == 0
    ds = only_split(build)
    records = page_records(out)
    assert len(ds) >= 4 and [r["i"] for r in records] == list(range(len(ds)))
    assert [r["id"] for r in records] == ds["id"]
    assert len(list((out / "pages").glob("*.js"))) == -(-len(ds) // 3)
    provenance_shown: set[str] = set()
    for k, (rec, row) in enumerate(zip(records, ds, strict=True)):
        assert [im["label"] for im in rec["imgs"]] == ["image_0", "image_1"]
        # A pair shares its initial noise (Prompt-to-Prompt), so compare with another row's image.
        other = ds[(k + 1) % len(ds)]["image_0"]
        for im, column in zip(rec["imgs"], ("image_0", "image_1"), strict=True):
            assert_depicts(out / im["src"], row[column], other)
        c0, c1 = rec["texts"]
        assert text_of(c0["segs"]) == row["caption_0"] and text_of(c1["segs"]) == row["caption_1"]
        # Where the two captions first differ lies inside the highlighted word of each.
        differ = len(os.path.commonprefix([row["caption_0"], row["caption_1"]]))
        for segs, word in ((c0["segs"], row["replaced_word"]), (c1["segs"], row["replacement_word"])):
            start, text = span(segs, "hl")
            assert text == word and start <= differ < start + len(word), (segs, differ)
        assert rec["facets"]["replaced word"] == [row["replaced_word"]]
        rejected = ["candidate rejected: directional"] if row["image_rejected_directional"] else []
        assert rec["facets"].get("skip reason", []) == rejected
        provenance_shown.update(assert_provenance_shown(rec, row))
    index = [
        e
        for p in sorted((out / "index").glob("*.js"))
        for e in json.loads(p.read_text().split(", ", 1)[1].rsplit(");", 1)[0])
    ]
    assert [e[0] for e in index] == list(range(len(ds)))
    assert [e[1] for e in index] == [f"{a} {b}".lower() for a, b in zip(ds["caption_0"], ds["caption_1"], strict=True)]
    stats = (out / "stats.html").read_text()
    for word, n in Counter(ds["replaced_word"]).items():
        assert f"<tr><td>{word}</td><td>{n}</td></tr>" in stats
    assert any(r["image_rejected_directional"] for r in ds)
    skipped = json.loads((build / "build_manifest.json").read_text())["skipped"]
    assert skipped
    for reason, n in skipped.items():
        assert f"<tr><td>{reason}</td><td>{n}</td></tr>" in stats
    for column in ("clip_score_0", "similarity", "perplexity"):
        assert Image.open(out / f"stats/hist_{column}.png").size[0] > 100
    # The build has every key column (generation parameters and scores), each shown on some card.
    assert KEY_PROVENANCE <= set(ds.column_names)
    assert {n for n in KEY_PROVENANCE if any(v is not None for v in ds[n])} <= provenance_shown
    summary = json.loads((out / "gallery.json").read_text())
    assert summary["complete"] and summary["rows"] == len(ds) and summary["kind"] == "counterfactual"
    assert 0 < summary["first_page_bytes"] < 1e6  # the first screen loads fast whatever the size


def test_decorrelation_gallery_strikes_removed_words_and_outlines_the_mask(builds, tmp_path):
    build = builds("decorrelation")
    out = tmp_path / "gallery"
    assert show(build, "--output", out) == 0
    ds = only_split(build)
    records = page_records(out)
    assert len(records) == len(ds) >= 3
    struck = 0
    for rec, row in zip(records, ds, strict=True):
        assert rec["facets"]["removed class"] == row["removed_classes"]
        original, synthetic = rec["imgs"]
        assert (original["label"], synthetic["label"]) == ("original", "synthetic")
        assert_depicts(out / original["src"], row["original_image"])
        # The outline: the mask's border pixels are red on the synthetic thumbnail.
        thumb = np.asarray(Image.open(out / synthetic["src"]).convert("RGB"), dtype=int)
        mask = (
            np.asarray(row["mask"].convert("L").resize((thumb.shape[1], thumb.shape[0]), Image.Resampling.NEAREST))
            >= 128
        )
        inner = mask.copy()
        inner[1:-1, 1:-1] &= mask[:-2, 1:-1] & mask[2:, 1:-1] & mask[1:-1, :-2] & mask[1:-1, 2:]
        border = mask & ~inner
        assert border.any(), row["row_id"]
        red = (thumb[..., 0] > 170) & (thumb[..., 1] < 110) & (thumb[..., 2] < 110)
        assert red[border].mean() > 0.8, row["row_id"]
        texts = {t["label"]: t["segs"] for t in rec["texts"]}
        assert text_of(texts["original caption"]) == row["original_caption"]
        assert text_of(texts["synthetic caption"]) == row["caption"]
        kept = "".join(s[0] for s in texts["original caption"] if s[1] != "del")
        words = lambda s: re.findall(r"[\w'-]+", s.lower())  # noqa: E731
        assert words(kept) == words(row["caption"]), texts
        struck += any(s[1] == "del" for s in texts["original caption"])
        assert {"removal", "fill", "seed"} <= set(assert_provenance_shown(rec, row))
    assert struck == len(ds)  # every np_removal caption lost a noun phrase
    stats = (out / "stats.html").read_text()
    manifest = json.loads((build / "build_manifest.json").read_text())
    for reason, n in manifest["skipped"].items():
        assert f"<tr><td>{reason}</td><td>{n}</td></tr>" in stats


def test_eccv_gallery_groups_each_query_s_positives_by_source(builds, tmp_path, capsys):
    build = builds("eccv-positives")
    out = tmp_path / "gallery"
    assert show(build, "--output", out, "--page-size", "500") == 0  # default: the config with images
    ds = load_dataset(str(build), "i2t", split="test")
    records = page_records(out)
    assert [r["id"] for r in records] == [str(i) for i in ds["image_id"]]
    grouped = 0
    for rec, row in zip(records, ds, strict=True):
        assert len(rec["imgs"]) == (row["image"] is not None)
        expected: dict[str, list[str]] = {}
        for k, (cid, source) in enumerate(zip(row["positive_caption_ids"], row["positive_sources"], strict=True)):
            text = row["positive_captions"][k] if row["positive_captions"] else None
            expected.setdefault(f"{source} positives", []).append(text or f"caption {cid}")
        shown = {t["label"].rsplit(" (", 1)[0]: text_of(t["segs"]).split(" | ") for t in rec["texts"]}
        assert shown == expected, row["image_id"]
        assert rec["facets"].get("positive source", []) == sorted(set(row["positive_sources"]))
        grouped += len(expected) > 1
    assert grouped > 0  # some query has positives from several sources
    one_error_line(capsys, [build, "--config", "t2i", "--output", out], "'t2i' has no image column")


def test_a_published_version_gives_the_same_gallery_as_the_build(builds, local_hub, tmp_path):
    build = builds("coco-captions")
    repo = "tester/gallery-coco-captions"
    assert cli_main(["publish", str(build), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    assert show(build, "--output", tmp_path / "local", "--split", "val") == 0
    assert show(repo, "--revision", "v1.0.0", "--output", tmp_path / "hub", "--split", "val") == 0
    local, hub = page_records(tmp_path / "local"), page_records(tmp_path / "hub")
    assert len(local) == len(only_split_named(build, "val")) and local == hub
    for rec in local:
        for im in rec["imgs"]:
            assert (tmp_path / "local" / im["src"]).read_bytes() == (tmp_path / "hub" / im["src"]).read_bytes()
    assert rec["texts"] and rec["facets"]["class"]
    # `make demo` links its galleries from one page.
    from builders.viewer.render import write_gallery_index

    index = write_gallery_index(tmp_path, {"local": tmp_path / "local", "hub": tmp_path / "hub"})
    links = [link for link in re.findall(r'href="([^"]+)"', index.read_text()) if link != "data:,"]
    assert {"local/index.html", "hub/index.html", "local/stats.html", "local/style.css"} <= set(links)
    assert all((tmp_path / link).is_file() for link in links)


def test_a_rebuilt_folder_of_the_same_name_shows_its_own_rows(builds, tmp_path):
    """`load_dataset` caches a local folder by its base name; the gallery must not show a stale copy."""
    import shutil

    import pyarrow.parquet as pq

    build = builds("coco-captions")
    first, second = tmp_path / "one" / "cc", tmp_path / "two" / "cc"
    shutil.copytree(build, first)
    shutil.copytree(build, second)
    shard = second / "data" / "val-00000-of-00001.parquet"
    pq.write_table(pq.read_table(shard).slice(0, 2), shard)
    assert show(first, "--output", tmp_path / "g1", "--split", "val") == 0
    assert show(second, "--output", tmp_path / "g2", "--split", "val") == 0
    assert len(page_records(tmp_path / "g1")) == len(only_split_named(build, "val")) > 2
    assert len(page_records(tmp_path / "g2")) == 2


def only_split_named(build: Path, split: str):
    return load_dataset(str(build), split=split)


def test_bad_input_is_one_clear_line(builds, local_hub, tmp_path, capsys):
    out = tmp_path / "gallery"
    not_a_build = tmp_path / "photos"
    not_a_build.mkdir()
    (not_a_build / "cat.txt").write_text("not a build")
    one_error_line(capsys, [not_a_build, "--output", out], str(not_a_build), "not a build folder")
    (not_a_build / "README.md").write_text("# my notes\n")
    one_error_line(capsys, [not_a_build, "--output", out], "no YAML `configs:`")
    one_error_line(capsys, [tmp_path / "no" / "such" / "dir", "--output", out], "neither a build folder")
    one_error_line(capsys, ["tester/no-such-dataset", "--output", out], "no such dataset repo")
    build = builds("coco-captions")
    repo = "tester/gallery-errors"
    assert cli_main(["publish", str(build), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    one_error_line(capsys, [repo, "--revision", "v9.9.9", "--output", out], "no revision 'v9.9.9'")
    one_error_line(capsys, [build, "--config", "captions", "--output", out], "'captions' has no image column")
    one_error_line(capsys, [build, "--config", "nope", "--output", out], "no config 'nope'")
    one_error_line(capsys, [build, "--split", "train", "--output", out], "no split 'train'")
    one_error_line(capsys, [build, "--revision", "v1.0.0", "--output", out], "Hub datasets only")
    assert not out.exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("keep me")
    one_error_line(capsys, [build, "--output", tmp_path / "busy"], "not empty")
    assert (tmp_path / "busy" / "thesis.tex").read_text() == "keep me"


def test_serve_serves_the_written_gallery(builds, tmp_path):
    build = builds("coco-captions")
    out = tmp_path / "gallery"
    cmd = [sys.executable, "-m", "builders.app.cli", "show", str(build), "--output", str(out), "--serve", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "show --serve exited without serving"
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "index.html", timeout=30) as response:
            assert response.read() == (out / "index.html").read_bytes()
        with urllib.request.urlopen(url + "pages/page-00000.js", timeout=30) as response:
            assert response.read() == (out / "pages/page-00000.js").read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
