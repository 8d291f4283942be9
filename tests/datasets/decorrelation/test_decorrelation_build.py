"""`counterfactory build decorrelation` on the COCO fixture with the tiny profile.

Rows are checked against the raw fixture JSON and the brute-force selection rules of
`helpers/selection_reference.py`; gallery mentions against the regex matcher of `reference_odmap.py`; the
ODmAP product is fed through `evaluate_modules/odmap` and compared with a brute-force ODmAP@k.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from datasets import load_dataset
from PIL import Image, ImageFilter

from builders.decorrelation.captions import CaptionSynthesizer, EntityPhrases
from builders.decorrelation.config import CLIP_TEMPLATES, CaptionConfig, FillConfig, SourceConfig
from builders.app.cli import main as cli_main
from builders.engine.errors import InputFileError, UserFacingError
from builders.devtools.fixtures.coco import CocoFixtureConfig, drawn_object_mask, write_coco_fixture
from builders.decorrelation.fill import ImageFiller
from builders.models.profiles import resolve_profile
from counterfactory_metrics.odmap.class_match import COCO_CLASSES, COCO_TABLE
from counterfactory_metrics.odmap.noun_phrases import noun_phrases
from loading_scripts.flickr30k import parse_entity_sentence
from loading_scripts.records import SourceCaption

from helpers.reference_odmap import reference_match, reference_odmap_from_rankings
from helpers.build_helpers import accelerate_cmd, kill_after_parts, shard_digests
from helpers.decorrelation_fixtures import build_args, flickr_entities, raw_images
from helpers.selection_reference import brute_force, touched_pixels

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def one_thread():
    # Results do not depend on the thread count; on a busy 2-core machine one thread is faster.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def built(coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path_factory, one_thread) -> Path:
    out = tmp_path_factory.mktemp("decorrelation") / "out"
    assert cli_main(["build", "decorrelation", *build_args(coco_fixture_dir, out, tiny_models_dir)]) == 0
    return out


def test_rows_follow_the_rules_and_the_source(built, coco_fixture_dir):
    raw = raw_images(coco_fixture_dir)
    manifest = json.loads((built / "build_manifest.json").read_text())
    expected, reasons = {}, Counter()
    for image_id, im in raw.items():
        if im["split"] in ("train", "restval", "test"):
            got, why = brute_force(im["boxes"], im["w"], im["h"])
            reasons.update(why)
            for anchor, kind, removed, present, region in got:
                expected[(image_id, anchor)] = (im["split"], kind, removed, present, region)
    skipped = manifest["skipped"]
    assert {k: v for k, v in skipped.items() if not k.startswith("caption_")} == dict(reasons)
    dilation = manifest["config"]["fill"]["mask_dilation"]
    assert dilation > 0  # the default grows the filled region
    assert manifest["errors"] == {}

    train = load_dataset(str(built), split="train")
    queries = load_dataset(str(built), "odmap_queries", split="test")
    want_test = {key for key, v in expected.items() if v[0] == "test"}
    assert {(r["image_id"], r["anchor_class"]) for r in queries} == want_test
    want_train = {key for key, v in expected.items() if v[0] != "test"}
    got_train = [(r["image_id"], r["anchor_class"]) for r in train]
    # One caption per image: each candidate is a row or a counted caption skip.
    assert len(set(got_train)) == len(got_train) and set(got_train) <= want_train
    assert len(train) + sum(v for k, v in skipped.items() if k.startswith("caption_")) == len(want_train)
    assert set(train["removal"]) == {"single", "multi"}

    for row in [*train, *queries]:
        split, kind, removed, present, region = expected[(row["image_id"], row["anchor_class"])]
        im = raw[row["image_id"]]
        assert row["source_split"] == split and row["removal"] == kind
        assert set(row["removed_classes"]) == removed and set(row["present_classes"]) == present
        assert {b["category"] for b in row["removed_boxes"]} == removed
        assert row["region_fraction"] == pytest.approx(len(region) / (im["w"] * im["h"]))
        mask = np.asarray(row["mask"]) > 0  # the filled region: the removed boxes grown by `dilation`
        filled = set().union(
            *(
                touched_pixels(box, im["w"], im["h"], grow=dilation)
                for c, box in im["boxes"]
                if c in removed and touched_pixels(box, im["w"], im["h"])
            )
        )
        assert set(map(tuple, np.argwhere(mask).tolist())) == filled
        source = np.asarray(Image.open(im["file"]).convert("RGB"))
        synthetic = np.asarray(row["image"])
        assert synthetic.shape == source.shape
        assert np.array_equal(synthetic[~mask], source[~mask])  # only the removed region changed
        assert row["fill"] == "inpaint" and row["fill_model"].startswith("local:sd_inpaint@sha256:")

    for row in train:  # np_removal: y' is y minus words, and y mentioned a removed class
        original = raw[row["image_id"]]["captions"][row["caption_id"]]
        assert row["original_caption"] == original
        assert any(reference_match(c, original, COCO_TABLE) for c in row["removed_classes"])
        words, kept = re.findall(r"\w+", original), iter(re.findall(r"\w+", original))
        assert all(w in kept for w in re.findall(r"\w+", row["caption"])), (original, row["caption"])
        assert len(re.findall(r"\w+", row["caption"])) < len(words)


def test_gallery_holds_every_caption_with_reference_mentions(built, coco_fixture_dir):
    raw = raw_images(coco_fixture_dir)
    gallery = load_dataset(str(built), "odmap_gallery", split="test")
    want = {cid: (image_id, text) for image_id, im in raw.items() for cid, text in im["captions"].items()}
    assert sorted(gallery["caption_id"]) == sorted(want)
    for row in gallery:
        assert (row["image_id"], row["caption"]) == want[row["caption_id"]]
        phrases = noun_phrases(row["caption"])
        ref = [any(reference_match(c, n, COCO_TABLE) for n in phrases) for c in COCO_CLASSES]
        assert row["mentions"] == ref, row["caption"]
        assert row["mentioned_classes"] == [c for c, hit in zip(COCO_CLASSES, ref, strict=True) if hit]


def test_odmap_product_feeds_the_evaluate_module(built, tiny_models_dir, one_thread):
    from counterfactory_metrics.map_at_r.topk import topk_from_embeddings
    from builders.models.loaders import load_clip

    queries = load_dataset(str(built), "odmap_queries", split="test")
    gallery = load_dataset(str(built), "odmap_gallery", split="test")
    model, processor = load_clip(resolve_profile("tiny", tiny_models_dir).clip)
    with torch.no_grad():  # the card's recipe, with the tiny CLIP
        image_emb = model.get_image_features(
            **processor(images=list(queries["image"]), return_tensors="pt")
        ).pooler_output
        text_emb = model.get_text_features(
            **processor(text=list(gallery["caption"]), return_tensors="pt", padding=True, truncation=True)
        ).pooler_output
    topk, _ = topk_from_embeddings(image_emb, text_emb, k=10, normalize=True)
    odmap = evaluate.load(str(REPO_ROOT / "evaluate_modules" / "odmap"))
    result = odmap.compute(
        retrieved=topk.tolist(),
        removed_classes=list(queries["removed_classes"]),
        present_classes=list(queries["present_classes"]),
        mention_matrix=np.array(gallery["mentions"]),
        class_names=list(COCO_CLASSES),
    )
    mentioned = [set(m) for m in gallery["mentioned_classes"]]
    ref = reference_odmap_from_rankings(
        topk.tolist(),
        mentioned,
        [set(r) for r in queries["removed_classes"]],
        [set(p) for p in queries["present_classes"]],
        (1, 5, 10),
    )
    assert result["num_queries"] == len(queries) > 0
    for k in (1, 5, 10):
        assert result[f"ODmAP@{k}"] == pytest.approx(ref[k])


def test_publish_and_load_each_config_at_its_tag(built, local_hub):
    repo = "tester/decorrelation-fixture"
    assert cli_main(["publish", str(built), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    for config, split in (("default", "train"), ("odmap_queries", "test"), ("odmap_gallery", "test")):
        remote = load_dataset(repo, config, split=split, revision="v1.0.0")
        local = load_dataset(str(built), config, split=split)
        pictures = [c for c in ("image", "mask") if c in local.column_names]
        assert remote.remove_columns(pictures).to_list() == local.remove_columns(pictures).to_list()
        for column in pictures:
            assert all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(remote[column], local[column], strict=True)
            )
    readme = (built / "README.md").read_text()
    assert "GAN" in readme and "odmap_gallery" in readme and "region_too_large" in readme


def test_simulated_crash_resumes_to_identical_shards(built, coco_fixture_dir, tiny_models_dir, tmp_path, one_thread):
    out = tmp_path / "copy"
    shutil.copytree(built, out)
    (out / ".parts/stats/part-00003.json").unlink()
    part = next((out / ".parts").rglob("part-00003.parquet"))
    part.write_bytes(part.read_bytes()[:100])
    assert cli_main(["build", "decorrelation", *build_args(coco_fixture_dir, out, tiny_models_dir)]) == 0
    assert shard_digests(out) == shard_digests(built)


def _grow(mask: np.ndarray, n: int) -> np.ndarray:
    """Every pixel within n rows and n columns of a masked pixel."""
    h, w = mask.shape
    padded, out = np.pad(mask, n), np.zeros_like(mask)
    for di in range(2 * n + 1):
        for dj in range(2 * n + 1):
            out |= padded[di : di + h, dj : dj + w]
    return out


@pytest.mark.parametrize("dilation", [0, None])
def test_zero_fill_leaves_no_pixel_of_a_removed_object(
    coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path, dilation
):
    """The fixture paints each object at its (fractional) box; after a `zero` fill none of its
    painted pixels (outline included) may survive. With the default dilation the 2-pixel JPEG
    colour bleed around the object is gone too."""
    out = tmp_path / "zero"
    extra = ["--fill", "zero", "--products", "train", "--caption", "prompts"]
    extra += [] if dilation is None else ["--mask-dilation", str(dilation)]
    assert cli_main(["build", "decorrelation", *build_args(coco_fixture_dir, out, tiny_models_dir), *extra]) == 0
    raw = raw_images(coco_fixture_dir)
    rows = load_dataset(str(out), split="train")
    assert len(rows) > 10
    centre_rule_misses = 0
    for row in rows:
        im = raw[row["image_id"]]
        synthetic = np.asarray(row["image"])
        for category, (x, y, w, h) in im["boxes"]:
            if category not in row["removed_classes"]:
                continue
            painted = np.asarray(drawn_object_mask(category, (x, y, w, h), (im["w"], im["h"]))) > 0
            must_be_black = painted if dilation == 0 else _grow(painted, 2)
            assert (synthetic[must_be_black] == 0).all(), (row["row_id"], category)
            # The pixel-centre rule this replaced would leave painted pixels: the test can fail.
            rows_i, cols_j = np.nonzero(painted)
            centre_rule_misses += int(
                np.count_nonzero(
                    ~((x <= cols_j + 0.5) & (cols_j + 0.5 < x + w) & (y <= rows_i + 0.5) & (rows_i + 0.5 < y + h))
                )
            )
    assert centre_rule_misses > 0


def test_fill_methods_against_independent_computations(tiny_models_dir, one_thread):
    rng = np.random.RandomState(0)
    image = Image.fromarray(rng.randint(0, 256, (24, 32, 3)).astype(np.uint8))
    pixels = np.asarray(image)
    mask = np.zeros((24, 32), bool)
    mask[3:10, 5:20] = True
    mask[15:20, 25:30] = True
    for method, want in (
        ("zero", np.zeros(3)),
        ("mean", np.round(pixels[mask].mean(axis=0))),
        ("blur", None),
    ):
        out = np.asarray(ImageFiller(FillConfig(method=method, blur_radius=3)).fill(image, mask, 0))
        assert np.array_equal(out[~mask], pixels[~mask])
        if want is not None:
            assert (out[mask] == want.astype(np.uint8)).all(), method
        else:
            assert np.array_equal(out[mask], np.asarray(image.filter(ImageFilter.GaussianBlur(3)))[mask])
    filler = ImageFiller(FillConfig(model=resolve_profile("tiny", tiny_models_dir).sd_inpaint, steps=2, image_size=64))
    a, b, c = (np.asarray(filler.fill(image, mask, s)) for s in (7, 7, 8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(a[~mask], pixels[~mask]) and not np.array_equal(a[mask], pixels[mask])
    with pytest.raises(UserFacingError, match="multiple of 8"):
        FillConfig(model="x", image_size=60)
    with pytest.raises(UserFacingError, match="needs an inpainting model"):
        FillConfig(method="inpaint")


def test_caption_methods(tiny_models_dir, nltk_data_dir):
    caps = [SourceCaption(1, "A cat sleeping on the floor."), SourceCaption(2, "Two dogs fighting over a frisbee.")]
    image = Image.new("RGB", (32, 24), (90, 120, 30))
    prompts = CaptionSynthesizer(CaptionConfig("prompts", captions_per_image=3), EntityPhrases())
    made, reason = prompts.synthesize(caps, ["cat"], ["dog", "frisbee"], image, random.Random(5))
    want = random.Random(5).sample(CLIP_TEMPLATES, 3)
    assert reason is None and [m.text for m in made] == [t.format("dog and frisbee") for t in want]
    assert len(set(CLIP_TEMPLATES)) == 80

    from builders.decorrelation.captions import CocoPhrases

    np_removal = CaptionSynthesizer(CaptionConfig(captions_per_image=2), CocoPhrases())
    made, reason = np_removal.synthesize(caps, ["frisbee"], ["dog"], image, random.Random(0))
    assert reason is None and [(m.text, m.source.caption_id) for m in made] == [("Two dogs fighting over.", 2)]
    assert np_removal.synthesize(caps, ["bus"], ["dog"], image, random.Random(0)) == (
        [],
        "caption_no_matching_noun_phrase",
    )
    assert np_removal.synthesize([SourceCaption(3, "A dog."), caps[0]], ["dog"], ["cat"], image, random.Random(0)) == (
        [],
        "caption_nothing_left_after_removal",
    )

    captioner = CaptionSynthesizer(
        CaptionConfig("captioner", model=resolve_profile("tiny", tiny_models_dir).captioner, max_new_tokens=5),
        EntityPhrases(),
    )
    made, reason = captioner.synthesize(caps, ["cat"], ["dog"], image, random.Random(0))
    assert (reason is None and made[0].text.strip()) or (made == [] and reason == "caption_empty")
    with pytest.raises(UserFacingError, match="one caption per image"):
        CaptionConfig("captioner", model="m", captions_per_image=2)

    text, phrases = parse_entity_sentence(
        "[/EN#1/people A man] walks [/EN#2/animals his dog] in [/EN#3/scene the park] ."
    )
    entity = EntityPhrases().remove(SourceCaption(9, text, phrases), ["animals"])
    assert entity.caption == "A man walks in the park." and entity.removed_phrases == ("his dog",)
    assert EntityPhrases().remove(SourceCaption(9, "[x]"), ["people"]).reason == "no_matching_noun_phrase"
    assert EntityPhrases().mentions([SourceCaption(9, text, phrases)], ["animals", "vehicles", "people"]).tolist() == [
        [True, False, True]
    ]


def _adversarial_fixture(root: Path) -> dict[str, int]:
    """The fixture with broken inputs; returns which image got which problem."""
    write_coco_fixture(root, CocoFixtureConfig(n_images=24))
    raw = raw_images(root)
    eligible = sorted(
        i
        for i, im in raw.items()
        if im["split"] in ("train", "restval") and brute_force(im["boxes"], im["w"], im["h"])[0]
    )
    roles = dict(zip(("gray", "cmyk", "truncated", "no_nouns", "boxes"), eligible, strict=False))
    Image.open(raw[roles["gray"]]["file"]).convert("L").save(raw[roles["gray"]]["file"])
    Image.open(raw[roles["cmyk"]]["file"]).convert("CMYK").save(raw[roles["cmyk"]]["file"])
    data = raw[roles["truncated"]]["file"].read_bytes()
    raw[roles["truncated"]]["file"].write_bytes(data[: len(data) // 2])
    for path in (root / "annotations").glob("*.json"):
        doc = json.loads(path.read_text())
        for ann in doc["annotations"]:
            if ann["image_id"] == roles["no_nouns"] and "caption" in ann:
                ann["caption"] = "Very nice, isn't it?"
            elif ann["image_id"] == roles["boxes"] and "caption" in ann:
                ann["caption"] = "Ünïcödé — a café with a dog 🐕 and a frisbee, naïve!"
        if "categories" in doc and any(im["id"] == roles["boxes"] for im in doc["images"]):
            extra = [[500.0, 500.0, 10.0, 10.0], [10.0, 10.0, 0.0, 5.0]]  # outside; zero-area
            for n, box in enumerate(extra):
                doc["annotations"].append(
                    {
                        "id": 90_000 + n,
                        "image_id": roles["boxes"],
                        "category_id": 1,
                        "bbox": box,
                        "area": 0.0,
                        "iscrowd": 0,
                    }
                )
        path.write_text(json.dumps(doc))
    return roles


def test_adversarial_inputs_are_counted_not_fatal(tmp_path, tiny_models_dir, nltk_data_dir):
    root = tmp_path / "coco"
    roles = _adversarial_fixture(root)
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                *build_args(root, out, tiny_models_dir),
                "--fill",
                "mean",
                "--max-error-fraction",
                "0.5",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "build_manifest.json").read_text())
    assert manifest["errors"] == {"unreadable_image": 1}
    assert manifest["skipped"]["empty_box"] == 2
    assert manifest["skipped"]["caption_no_matching_noun_phrase"] >= 1
    train = load_dataset(str(out), split="train")
    ids = set(train["image_id"])
    assert roles["gray"] in ids and roles["cmyk"] in ids and roles["truncated"] not in ids
    assert roles["no_nouns"] not in ids
    assert all(np.asarray(img).ndim == 3 for img in train["image"])
    gallery = load_dataset(str(out), "odmap_gallery", split="test")
    unicode_rows = [r for r in gallery if r["image_id"] == roles["boxes"]]
    assert unicode_rows and all(set(r["mentioned_classes"]) == {"dog", "frisbee"} for r in unicode_rows)


@pytest.mark.accelerate
def test_two_processes_killed_and_resumed_equal_the_single_process_build(
    built, coco_fixture_dir, tiny_models_dir, tmp_path
):
    out = tmp_path / "multi"
    cmd = accelerate_cmd(
        REPO_ROOT / "builders/decorrelation/builder.py",
        *build_args(coco_fixture_dir, out, tiny_models_dir),
        "--expect-processes",
        "2",
    )
    n_parts = len(list((built / ".parts/stats").glob("*.json")))
    stats_dir = out / ".parts/stats"
    finished = kill_after_parts(cmd, stats_dir, min_parts=2, timeout=240, poll=0.02)
    assert 2 <= finished < n_parts, "the kill must land mid-way"

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {json.loads(p.read_text())["rank"] for p in stats_dir.glob("*.json")} == {0, 1}
    assert shard_digests(out) == shard_digests(built)


def test_flickr30k_with_entities(tmp_path, tiny_models_dir):
    root = tmp_path / "f30k"
    flickr_entities(root)
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                *build_args(root, out, tiny_models_dir)[2:],
                "--flickr30k-root",
                str(root),
                "--fill",
                "zero",
            ]
        )
        == 0
    )
    karpathy = json.loads((root / "dataset_flickr30k.json").read_text())["images"]
    train_ids = {int(Path(e["filename"]).stem) for e in karpathy if e["split"] == "train"}
    rows = load_dataset(str(out), split="train")
    assert {(r["image_id"], r["anchor_class"]) for r in rows} == {
        (i, c) for i in train_ids for c in ("animals", "people")
    }
    by_anchor = {r["anchor_class"]: r for r in rows}
    assert by_anchor["people"]["removed_boxes"] == [{"category": "people", "bbox": [5.0, 10.0, 40.0, 70.0]}]
    assert by_anchor["people"]["caption"] in {"walks with a small dog.", "A dog follows in the park.", "and a puppy."}
    gallery = load_dataset(str(out), "odmap_gallery", split="test")
    assert len(gallery) == 5 * len(karpathy)
    assert Counter(tuple(r["mentioned_classes"]) for r in gallery) == Counter(
        {("people", "animals"): 3 * len(karpathy), ("people",): len(karpathy), (): len(karpathy)}
    )

    from loading_scripts.flickr30k import Flickr30kSourceConfig, read_flickr30k

    test = read_flickr30k(Flickr30kSourceConfig(root, splits=("test",)))
    assert len(test) == sum(e["split"] == "test" for e in karpathy)
    assert [o.category for o in test[0].objects] == ["people", "animals"]
    assert all(r.split == "test" and r.folder == "flickr30k-images" and r.input_problem is None for r in test)

    from builders.decorrelation.source import read_source

    xml = next((root / "flickr30k_entities/Annotations").glob("*.xml"))
    xml.write_text("<annotation><size>")
    with pytest.raises(InputFileError, match=re.escape(xml.name) + ": malformed XML"):
        read_source(SourceConfig("flickr30k", root), ("train", "val", "test"))
    shutil.rmtree(root / "flickr30k_entities")
    with pytest.raises(UserFacingError, match="needs Flickr30k Entities"):
        read_source(SourceConfig("flickr30k", root), ("train",))
    with pytest.raises(UserFacingError, match="not Flickr30k Entities types"):
        SourceConfig("flickr30k", root, flickr_classes=("people", "cats"))
