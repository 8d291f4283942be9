"""Plots in the cards: a build's card embeds an example grid and the key histograms, written into
the build (figures/*.png) and published with it, so the Hub's card renderer finds every linked
image at the tag; the figures are the same bytes when written again. ODmAP's per-class bar chart
helper, through `evaluate.load`, equals ODmAP of each class's queries alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi, hf_hub_download
from PIL import Image

from builders.app.cli import main as cli_main
from builders.engine.no_follow import RootDir
from builders.viewer.card_figures import write_card_figures

from helpers.gallery_helpers import fixture_build

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO_ROOT = Path(__file__).resolve().parents[2]


def linked_images(card: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", card)


def assert_not_blank(path: Path) -> None:
    pixels = np.asarray(Image.open(path).convert("RGB"))
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.std() > 10, path


@pytest.mark.parametrize(
    "name, histograms",
    [
        (
            "coco-counterfactuals",
            ["clip_score_0", "clip_score_1", "clip_directional", "clip_image_similarity", "similarity", "perplexity"],
        ),
        ("decorrelation", ["region_fraction"]),
    ],
)
def test_card_embeds_examples_and_histograms_published_with_the_build(
    name, histograms, session_tmp, coco_fixture_dir, tiny_models_dir, nltk_data_dir, local_hub
):
    build = fixture_build(name, session_tmp, coco_fixture_dir, tiny_models_dir)
    card = (build / "README.md").read_text()
    links = linked_images(card)
    assert links == ["figures/examples.png"] + [f"figures/hist_{c}.png" for c in histograms]
    manifest = json.loads((build / "build_manifest.json").read_text())
    assert [f["path"] for f in manifest["card_figures"]] == links
    for link in links:
        assert_not_blank(build / link)
    before = {link: (build / link).read_bytes() for link in links}
    with RootDir(build) as out:
        write_card_figures(out, manifest)
    assert {link: (build / link).read_bytes() for link in links} == before

    repo = f"tester/cards-{name}"
    assert cli_main(["publish", str(build), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    published = set(HfApi().list_repo_files(repo, repo_type="dataset", revision="v1.0.0"))
    hub_card = Path(hf_hub_download(repo, "README.md", repo_type="dataset", revision="v1.0.0")).read_text()
    for link in linked_images(hub_card):  # what the Hub's renderer resolves against the repo
        assert link in published
        assert Path(hf_hub_download(repo, link, repo_type="dataset", revision="v1.0.0")).read_bytes() == before[link]


def test_odmap_per_class_bar_chart_equals_odmap_of_each_class_alone(tmp_path, monkeypatch):
    import evaluate

    rng = np.random.default_rng(3)
    classes = ["cat", "dog", "bird", "car"]
    mentions = rng.random((40, len(classes))) < 0.4
    removed, present = [], []
    for _ in range(30):
        picked = list(rng.permutation(classes))
        removed.append(picked[: rng.integers(1, 3)])
        present.append(picked[3:])
    retrieved = [list(rng.choice(40, size=5, replace=False)) for _ in removed]
    odmap = evaluate.load(str(REPO_ROOT / "evaluate_modules" / "odmap"))
    common = dict(mention_matrix=mentions, class_names=classes, k_values=[1, 5])
    plot = tmp_path / "per_class.png"
    result = odmap.compute(
        retrieved=retrieved, removed_classes=removed, present_classes=present, per_class_plot_path=str(plot), **common
    )
    assert result["per_class_plot_path"] == str(plot)
    assert_not_blank(plot)
    assert sorted(result["per_class"]) == sorted({c for r in removed for c in r})
    for cls, scores in result["per_class"].items():
        keep = [q for q, r in enumerate(removed) if cls in r]
        alone = odmap.compute(
            retrieved=[retrieved[q] for q in keep],
            removed_classes=[removed[q] for q in keep],
            present_classes=[present[q] for q in keep],
            **common,
        )
        assert scores == pytest.approx({k: alone[k] for k in ("ODmAP@1", "ODmAP@5")})
