"""`counterfactory build eccv-positives`: the published ECCV Caption annotations as a dataset.

The expected values come from the JSON files shipped in `eccv_caption`, read here with `json`
(not with the project's reader), and from the paper (Appendix C.1 counts, Table 3 multiplicity).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import evaluate
import numpy as np
import pytest
from datasets import load_dataset

from builders.app.cli import main as cli_main
from helpers.eccv_fixtures import package_json, write_test_image_root

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO_ROOT = Path(__file__).resolve().parents[3]
MAP_AT_R = REPO_ROOT / "evaluate_modules" / "map_at_r"


@pytest.fixture(scope="module")
def build(tmp_path_factory, coco_fixture_dir) -> Path:
    out = tmp_path_factory.mktemp("eccv") / "build"
    assert (
        cli_main(
            [
                "build",
                "eccv-positives",
                "--coco-root",
                str(coco_fixture_dir),
                "--output",
                str(out),
                "--part-size",
                "8192",
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def tables(build):
    return {name: load_dataset(str(build), name, split="test") for name in ("i2t", "t2i", "removed")}


def dataset_positives(tables, source: str, direction: str) -> dict[int, list[int]]:
    rows = tables[direction]
    key = "image_id" if direction == "i2t" else "caption_id"
    item = "caption" if direction == "i2t" else "image"
    column = f"positive_{item}_ids" if source == "eccv" else f"{source}_{item}_ids"
    if source == "eccv":
        return {r[key]: r[column] for r in rows if r["eccv_query"]}
    return {r[key]: r[column] for r in rows if r[column] is not None}


@pytest.mark.parametrize("source", ["eccv", "cxc", "coco"])
@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_round_trip_equals_the_package_json(tables, source, direction):
    # Every query and every positive of the full published set, in file order.
    assert dataset_positives(tables, source, direction) == package_json(source, direction)


def test_provenance_labels_and_fixture_content(tables, coco_fixture_dir):
    coco, cxc = package_json("coco", "i2t"), package_json("cxc", "i2t")
    for row in tables["i2t"].select_columns(["image_id", "positive_caption_ids", "positive_sources"]):
        expected = [
            "coco" if c in coco.get(row["image_id"], []) else "cxc" if c in cxc.get(row["image_id"], []) else "eccv"
            for c in row["positive_caption_ids"]
        ]
        assert row["positive_sources"] == expected
    # Images and texts come from the COCO root only where it holds them (its ids are not the
    # real test ids, so nearly all are null); a query is never dropped for lacking them.
    captions = json.loads((coco_fixture_dir / "annotations" / "captions_val2014.json").read_text())
    fixture_images = {im["id"] for im in captions["images"]}
    with_image = [
        r["image_id"] for r in tables["i2t"].select_columns(["image_id", "file_name"]) if r["file_name"] is not None
    ]
    assert set(with_image) <= fixture_images
    assert len(tables["i2t"]) == len(set(coco) | set(cxc) | set(package_json("eccv", "i2t")))


def test_removed_list_matches_the_paper_and_the_test_split(tables):
    removed = tables["removed"]
    reasons = [r["reason"] for r in removed]
    assert (
        reasons.count("meaningless"),
        reasons.count("semantically_wrong"),
        reasons.count("duplicate_of_train_image"),
    ) == (18, 14, 1)
    test_captions = package_json("coco", "t2i")
    eccv_t2i = package_json("eccv", "t2i")
    for row in removed:
        if row["kind"] == "caption":  # every id is a real COCO test caption, none an ECCV query
            assert row["id"] in test_captions and row["id"] not in eccv_t2i
        else:
            assert row["id"] in package_json("coco", "i2t") and row["id"] not in package_json("eccv", "i2t")


def random_rankings(
    positives: dict[int, list[int]], gallery: list[int], rng: random.Random, extra: int = 20
) -> dict[int, list[int]]:
    out, known = {}, set(gallery)
    for query, pos in positives.items():
        pos = [p for p in pos if p in known]  # a few CxC/ECCV ids lie outside the 5K test split
        ranked = list(dict.fromkeys(pos + rng.sample(gallery, extra + 10)))[: len(pos) + extra]
        rng.shuffle(ranked)
        out[query] = ranked
    return out


def test_eccv_metrics_from_the_dataset_equal_those_from_the_package(tables):
    from counterfactory_metrics.map_at_r.eccv_annotations import Positives
    from counterfactory_metrics.map_at_r.eccv_suite import EccvAnnotations, EccvSuiteConfig, eccv_suite
    from loading_scripts.eccv import coco_test_caption_ids

    rng = random.Random(0)
    captions, images = list(package_json("coco", "t2i")), list(package_json("coco", "i2t"))
    i2t = random_rankings(
        package_json("coco", "i2t") | package_json("cxc", "i2t") | package_json("eccv", "i2t"), captions, rng
    )
    t2i = random_rankings(package_json("coco", "t2i") | package_json("eccv", "t2i"), images, rng)
    for query, pos in package_json("cxc", "t2i").items():
        t2i[query] = list(dict.fromkeys(t2i[query] + pos))
    map_at_r = evaluate.load(str(MAP_AT_R))

    # Plain mAP@R over ECCV queries: references from the dataset vs from the package files.
    for direction, ranks in (("i2t", i2t), ("t2i", t2i)):
        ours = dataset_positives(tables, "eccv", direction)
        queries = sorted(ours)
        got = map_at_r.compute(
            predictions=[ranks[q] for q in queries], references=[ours[q] for q in queries], k_values=[1, 5]
        )
        ref = package_json("eccv", direction)
        expected = map_at_r.compute(
            predictions=[ranks[q] for q in queries], references=[ref[q] for q in queries], k_values=[1, 5]
        )
        assert got == expected and 0 < got["map_at_r"] < 1

    # The whole suite: the metric's own (package) annotations vs annotations rebuilt from the dataset.
    metrics = ["eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_r1", "coco_5k_r1"]
    expected = map_at_r.compute(i2t_rankings=i2t, t2i_rankings=t2i, target_metrics=metrics)

    def positives(source):
        return Positives(
            **{
                d: {q: np.asarray(v, dtype=np.int64) for q, v in dataset_positives(tables, source, d).items()}
                for d in ("i2t", "t2i")
            }
        )

    ours = EccvAnnotations(
        eccv=positives("eccv"), cxc=positives("cxc"), coco=positives("coco"), coco_test_ids=coco_test_caption_ids()
    )
    got = eccv_suite(i2t, t2i, EccvSuiteConfig(target_metrics=tuple(metrics)), ours)
    # Rows are in id order, the files in their own: the means sum the same terms in another order.
    assert got.keys() == expected.keys()
    for name, values in expected.items():
        assert got[name] == pytest.approx(values, rel=1e-12, abs=0)


def test_card_recomputes_the_paper_multiplicity(build):
    card = (build / "README.md").read_text()
    # Table 3 of the paper, in the rendered table row (the prose below it quotes them too).
    assert "positives of COCO retrieval: ECCV Caption" in card
    assert "| positive multiplicity vs COCO | ×3.58 | ×8.47 |" in card
    assert "| ECCV positives | 22550 | 11279 |" in card
    # Per-source counts from the package's JSON: an ECCV positive is `coco` when it is an
    # original pair, else `cxc` when CxC lists it, else `eccv` (verified by the MITL only).
    counts = {}
    for direction in ("i2t", "t2i"):
        eccv, coco, cxc = (package_json(source, direction) for source in ("eccv", "coco", "cxc"))
        n = {"coco": 0, "cxc": 0, "eccv": 0}
        for query, positives in eccv.items():
            for p in positives:
                n["coco" if p in coco.get(query, ()) else "cxc" if p in cxc.get(query, ()) else "eccv"] += 1
        counts[direction] = n
    for source, row in (
        ("coco", "of which original COCO pairs (`coco`)"),
        ("cxc", "of which CxC, not COCO (`cxc`)"),
        ("eccv", "of which MITL-verified only (`eccv`)"),
    ):
        assert f"| {row} | {counts['i2t'][source]} | {counts['t2i'][source]} |" in card, source
    assert sum(counts["i2t"].values()) == 22550 and sum(counts["t2i"].values()) == 11279
    assert card.startswith("---") and "\nlicense: cc-by-4.0\n" in card.split("---")[1]
    assert "config_name: pm" not in card  # the fixture holds no instance of a real test image


def test_load_from_local_hub_at_tag(build, tables, local_hub):
    repo = "tester/eccv-caption-positives"
    assert cli_main(["publish", str(build), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    for name in ("i2t", "t2i", "removed"):
        remote = load_dataset(repo, name, split="test", revision="v1.0.0")
        columns = [c for c in remote.column_names if c != "image"]
        assert remote.select_columns(columns).to_list() == tables[name].select_columns(columns).to_list()


def test_pm_config_equals_brute_force(tmp_path):
    """A COCO root holding 12 real test images (tiny JPEGs, made-up boxes): PM from instances."""
    rng = random.Random(3)
    coco_i2t = package_json("coco", "i2t")
    images = sorted(rng.sample(sorted(coco_i2t), 12))
    classes = {i: sorted(rng.sample([1, 2, 3, 4], rng.randint(1, 2))) for i in images}
    root = write_test_image_root(tmp_path / "coco", classes)
    out = tmp_path / "build"
    assert (
        cli_main(
            [
                "build",
                "eccv-positives",
                "--coco-root",
                str(root),
                "--output",
                str(out),
                "--pm-zeta",
                "1",
                "--part-size",
                "8192",
            ]
        )
        == 0
    )
    pm_i2t = {r["query_id"]: r["pm_positive_ids"] for r in load_dataset(str(out), "pm", split="i2t")}
    pm_t2i = {r["query_id"]: r["pm_positive_ids"] for r in load_dataset(str(out), "pm", split="t2i")}
    expected_i2t, expected_t2i = {}, {}
    for a in images:
        matches = [b for b in images if b != a and len(set(classes[a]) ^ set(classes[b])) <= 1]
        if matches:
            expected_i2t[a] = sorted(c for b in matches for c in coco_i2t[b])
            for c in coco_i2t[a]:
                expected_t2i[c] = sorted(matches)
    assert pm_i2t == expected_i2t and pm_t2i == expected_t2i and pm_i2t
    i2t = load_dataset(str(out), "i2t", split="test")
    shown = {r["image_id"]: r for r in i2t if r["image"] is not None}
    assert sorted(shown) == images
    for i, row in shown.items():
        assert all(
            t == f"caption {c}"
            for c, t in zip(row["positive_caption_ids"], row["positive_captions"], strict=True)
            if t is not None
        )


@pytest.mark.accelerate
def test_two_processes_write_the_same_shards(build, coco_fixture_dir, tmp_path):
    import subprocess

    from helpers.build_helpers import accelerate_cmd, shard_digests

    out = tmp_path / "multi"
    cmd = accelerate_cmd(
        REPO_ROOT / "builders/eccv_positives/builder.py",
        "--coco-root",
        str(coco_fixture_dir),
        "--output",
        str(out),
        "--part-size",
        "8192",
        "--expect-processes",
        "2",
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stats = [json.loads(p.read_text()) for p in (out / ".parts/stats").glob("*.json")]
    assert {s["rank"] for s in stats} == {0, 1}
    assert shard_digests(out) == shard_digests(build)
