"""The gallery in a real browser (Debian's chromium + chromedriver, driven by Selenium), opened
from disk as a user opens it: every thumbnail of the first page loads, the swapped word is
highlighted, a filter and the search narrow the rows to exactly the matching ones, paging shows
the next rows, the stats page's plots load, nothing is logged to the console, and a screenshot
shows the page. `make test` installs chromium when it is missing (.ci/bootstrap.sh); here a
missing browser fails."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from PIL import Image

from helpers.browser_helpers import assert_images_load, console_errors, wait_ready
from helpers.gallery_helpers import fixture_build, only_split, show

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

PAGE = 4


@pytest.fixture(scope="module")
def galleries(session_tmp, coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("galleries")
    out = {}
    for name in ("coco-counterfactuals", "decorrelation"):
        build = fixture_build(name, session_tmp, coco_fixture_dir, tiny_models_dir)
        assert show(build, "--output", root / name, "--page-size", PAGE) == 0
        out[name] = (build, root / name)
    return out


def card_ids(driver) -> list[str]:
    return [h.text.split(" · ", 1)[1] for h in driver.find_elements("css selector", "article.row > header")]


def test_counterfactual_gallery_in_chromium(browser, galleries, tmp_path):
    from selenium.webdriver.support.ui import Select

    build, gallery = galleries["coco-counterfactuals"]
    ds = only_split(build)
    rows = {r["id"]: r for r in ds}
    browser.get((gallery / "index.html").as_uri())
    wait_ready(browser, {"page": 0, "q": "", "filters": {}})
    assert card_ids(browser) == ds["id"][:PAGE]
    assert assert_images_load(browser) == 2 * PAGE
    for card in browser.find_elements("css selector", "article.row"):
        row = rows[card.find_element("css selector", "header").text.split(" · ", 1)[1]]
        marks = [m.text for m in card.find_elements("css selector", ".texts mark.hl")]
        assert marks == [row["replaced_word"], row["replacement_word"]]
        background = card.find_element("css selector", "mark.hl").value_of_css_property("background-color")
        assert background not in ("rgba(0, 0, 0, 0)", "transparent")
    browser.execute_script("window.scrollTo(0, 0)")
    shot = tmp_path / "counterfactuals.png"
    browser.save_screenshot(str(shot))

    # Paging: the next page holds the next rows, in order.
    browser.find_element("id", "next").click()
    wait_ready(browser, {"page": 1, "q": "", "filters": {}})
    assert card_ids(browser) == ds["id"][PAGE : 2 * PAGE]
    assert "page 2 of" in browser.find_element("id", "status").text
    assert_images_load(browser)

    # A filter narrows the rows to exactly those with that replaced word.
    counts = Counter(ds["replaced_word"])
    word = min(counts, key=lambda w: (counts[w], w))
    assert counts[word] < len(ds)
    Select(browser.find_element("css selector", 'select[data-facet="replaced word"]')).select_by_value(word)
    wait_ready(browser, {"page": 0, "q": "", "filters": {"replaced word": word}})
    expected = [r["id"] for r in ds if r["replaced_word"] == word]
    assert card_ids(browser) == expected[:PAGE]
    assert f"{len(expected)} of {len(ds)} rows" in browser.find_element("id", "status").text
    assert_images_load(browser)

    # The skip-reason filter: rows where some candidate was rejected.
    browser.get((gallery / "index.html").as_uri() + "#")
    browser.refresh()
    wait_ready(browser, {"page": 0, "q": "", "filters": {}})
    reason = "candidate rejected: directional"
    Select(browser.find_element("css selector", 'select[data-facet="skip reason"]')).select_by_value(reason)
    wait_ready(browser, {"page": 0, "q": "", "filters": {"skip reason": reason}})
    expected = [r["id"] for r in ds if r["image_rejected_directional"] > 0]
    assert 0 < len(expected) < len(ds) and card_ids(browser) == expected[:PAGE]

    # Search over captions (case-insensitive substring of either caption), from the URL too.
    query = ds["caption_1"][0].split()[-1].strip(".").lower()
    browser.get((gallery / "index.html").as_uri() + f"#q={query}")
    browser.refresh()
    wait_ready(browser, {"page": 0, "q": query, "filters": {}})
    expected = [r["id"] for r in ds if query in f"{r['caption_0']} {r['caption_1']}".lower()]
    assert expected and card_ids(browser) == expected[:PAGE]

    assert console_errors(browser) == []
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[0] > 500 and pixels.std() > 20
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 500  # text, thumbnails, highlights


def test_decorrelation_gallery_and_stats_page_in_chromium(browser, galleries, tmp_path):
    build, gallery = galleries["decorrelation"]
    ds = only_split(build)
    browser.get((gallery / "index.html").as_uri())
    wait_ready(browser, {"page": 0, "q": "", "filters": {}})
    n = min(PAGE, len(ds))
    assert card_ids(browser) == ds["row_id"][:n]
    assert assert_images_load(browser) == 2 * n  # original | synthetic
    struck = [d.text.strip() for d in browser.find_elements("css selector", ".texts del")]
    assert len(struck) >= n and all(struck)
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(tmp_path / "decorrelation.png"))
    browser.get((gallery / "stats.html").as_uri())
    assert assert_images_load(browser) >= 2  # rows per removed class, region_fraction histogram
    assert console_errors(browser) == []
    pixels = np.asarray(Image.open(tmp_path / "decorrelation.png").convert("RGB"))
    assert pixels.std() > 20
