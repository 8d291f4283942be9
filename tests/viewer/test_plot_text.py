"""Text from data is plain text in every figure: captions, class names, model and metric names
holding `$...$` (a price, a code snippet, TeX that is not mathtext) are drawn as written, not
parsed as matplotlib mathtext, which fails on them. A build's card figures, `show`'s charts, the
metric modules' plots, the model-bias plot and the sweep summary all complete."""

from __future__ import annotations

import json
import re
from pathlib import Path

import evaluate
import numpy as np
from datasets import load_dataset
from PIL import Image

from builders.app.cli import main as cli_main

from helpers.gallery_helpers import page_records, show, text_of

REPO_ROOT = Path(__file__).resolve().parents[2]
SPACES = REPO_ROOT / "evaluate_modules"
#: Mathtext fails on an unknown command; two `$` of prices make a math span of the text between.
MARKUP = r"$\notacommand{x}$ costs $5 and $10"


def assert_drawn(path: Path) -> None:
    pixels = np.asarray(Image.open(path).convert("RGB"))
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.std() > 10, path


def markup_coco(source: Path, root: Path) -> Path:
    """A copy of the fixture COCO whose captions and class names all carry MARKUP."""
    import shutil

    shutil.copytree(source, root)
    for path in (root / "annotations").glob("*.json"):
        data = json.loads(path.read_text())
        for ann in data["annotations"]:
            if "caption" in ann:
                ann["caption"] = f"{ann['caption']} {MARKUP}"
        for category in data.get("categories", []):
            category["name"] = f"{category['name']} {MARKUP}"
        path.write_text(json.dumps(data))
    return root


def test_a_build_with_markup_in_captions_and_class_names_gets_its_card_and_gallery(
    tmp_path, coco_fixture_dir, nltk_data_dir
):
    coco = markup_coco(coco_fixture_dir, tmp_path / "coco")
    build = tmp_path / "build"
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(coco),
                "--splits",
                "val",
                "--output",
                str(build),
                "--part-size",
                "4",
            ]
        )
        == 0
    )
    manifest = json.loads((build / "build_manifest.json").read_text())
    card = (build / "README.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", card)
    assert links and links == [f["path"] for f in manifest["card_figures"]]
    for link in links:
        assert_drawn(build / link)
    rows = load_dataset(str(build), split="val")
    assert all(c.endswith(MARKUP) for r in rows for c in r["captions"])  # kept as written

    out = tmp_path / "gallery"
    assert show(build, "--output", out, "--split", "val") == 0
    records = page_records(out)
    assert text_of(records[0]["texts"][0]["segs"]) == rows[0]["captions"][0]
    assert all(c.endswith(MARKUP) for c in records[0]["facets"]["class"])
    stats = (out / "stats.html").read_text()
    plots = re.findall(r'<img src="(stats/[^"]+\.png)" alt="rows per class">', stats)
    assert len(plots) == 1
    assert_drawn(out / plots[0])


def test_gallery_charts_draw_markup_as_text(tmp_path):
    from builders.viewer import plots

    image = Image.new("RGB", (64, 64), (40, 90, 200))
    for path in (
        plots.bar_chart({MARKUP: 3, "plain": 1}, tmp_path / "bars.png", title=MARKUP, xlabel=MARKUP),
        plots.histogram([0.1, 0.2, 0.4], tmp_path / "hist.png", title=MARKUP, xlabel=MARKUP),
        plots.example_grid([([image], MARKUP), ([image, image], MARKUP)], tmp_path / "grid.png"),
    ):
        assert_drawn(path)


def test_itm_histogram_title_with_markup(tmp_path):
    itm = evaluate.load(str(SPACES / "itm_score_deltas"))
    rng = np.random.default_rng(0)
    names = ("g_cr_ir", "g_cr_io", "g_co_ir", "g_cc_ics", "g_cc_ios", "g_co_ics")
    result = itm.compute(
        **{n: rng.normal(size=20).tolist() for n in names}, histogram_path=str(tmp_path / "deltas.png"), title=MARKUP
    )
    assert_drawn(Path(result["histogram_path"]))


def test_odmap_per_class_plot_with_markup_class_names(tmp_path):
    odmap = evaluate.load(str(SPACES / "odmap"))
    classes = [f"cat {MARKUP}", "dog"]
    result = odmap.compute(
        retrieved=[[1, 2], [2, 0]],
        removed_classes=[[classes[0]], ["dog"]],
        present_classes=[["dog"], [classes[0]]],
        mention_matrix=np.array([[True, False], [False, True], [True, True]]),
        class_names=classes,
        k_values=[1, 2],
        per_class_plot_path=str(tmp_path / "per_class.png"),
    )
    assert sorted(result["per_class"]) == sorted(classes)
    assert_drawn(Path(result["per_class_plot_path"]))


def test_model_bias_plot_with_markup_model_names(tmp_path):
    from builders.eccv_positives.mitl.model_bias import ModelBiasConfig, write_report

    models = [f"models/clip {MARKUP}", "models/plain"]
    rows = [
        {"model": m, "annotation_set": s, "modality": mod, "map_at_r": v, "r_precision": v, "recall_at_1": v}
        for k, m in enumerate(models)
        for s in (*models, "all")
        for mod in ("i2t", "t2i")
        for v in [0.3 + 0.1 * k]
    ]
    out = write_report(ModelBiasConfig(tasks="t", state="s", output=str(tmp_path / "bias")), rows)
    assert_drawn(out / "model_bias.png")


def test_sweep_summary_plot_with_a_markup_metric_name(tmp_path):
    from training.sweep import main as sweep_main

    for seed, value in ((1, 0.5), (2, 0.7)):
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "run.json").write_text(
            json.dumps({"final_metrics": {MARKUP: value, "recall_at_1": value}})
        )
    assert sweep_main(["--summarize-only", "--output", str(tmp_path)]) == 0
    assert_drawn(tmp_path / "summary.png")
