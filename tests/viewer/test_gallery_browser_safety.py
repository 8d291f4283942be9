"""A hostile dataset's gallery in a real browser (chromium, as in test_gallery_browser.py): images
the gallery does not show (a path-only cell, undecodable bytes) are labelled placeholders, and
markup in captions and facet values (`<script>`, an `onerror` image, `$...$`) is shown as text,
never run, in the rows, the filter menu and the stats page."""

from __future__ import annotations

import datasets
import pytest

from helpers.gallery_helpers import show
from helpers.browser_helpers import assert_images_load, console_errors, wait_ready
from helpers.hostile_datasets import SHOWN_RGB, encoded, write_dataset

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

SCRIPT = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
MATH = r"$\notacommand{x}$ costs $5 and $10"
FEATURES = datasets.Features(
    {"image": datasets.Image(), "caption": datasets.Value("string"), "skip_reason": datasets.Value("string")}
)


def test_missing_images_and_markup_in_chromium(browser, tmp_path):
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(encoded((13, 200, 77)))
    build = write_dataset(
        tmp_path / "dataset",
        [
            {"image": {"bytes": encoded(SHOWN_RGB), "path": None}, "caption": SCRIPT, "skip_reason": SCRIPT},
            {"image": {"bytes": None, "path": str(secret)}, "caption": MATH, "skip_reason": MATH},
            {"image": {"bytes": b"not an image", "path": None}, "caption": "plain", "skip_reason": "x"},
        ],
        FEATURES,
    )
    out = tmp_path / "gallery"
    assert show(build, "--output", out) == 0
    browser.get((out / "index.html").as_uri())
    wait_ready(browser, {"page": 0, "q": "", "filters": {}})
    assert assert_images_load(browser) == 1
    placeholders = [m.text for m in browser.find_elements("css selector", "article.row .missing")]
    assert placeholders == ["image not shown: path_only", "image not shown: undecodable"]
    texts = [p.text for p in browser.find_elements("css selector", ".texts p")]
    assert texts == [f"caption{SCRIPT}", f"caption{MATH}", "captionplain"]
    options = [
        o.get_attribute("value")
        for o in browser.find_elements("css selector", 'select[data-facet="skip reason"] option')
    ]
    assert SCRIPT in options and MATH in options
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_elements("css selector", "main img[src='x']") == []

    browser.get((out / "stats.html").as_uri())
    assert assert_images_load(browser) == 1  # the chart of rows per skip reason
    cells = [td.get_attribute("textContent") for td in browser.find_elements("css selector", "td")]
    assert SCRIPT in cells and MATH in cells
    assert "path_only" in cells and "undecodable" in cells
    assert browser.execute_script("return window.pwned === undefined")
    assert console_errors(browser) == []
