"""A machine-in-the-loop round with the `counterfactory eccv` commands, on a fixture gallery and
two tiny machine annotators (transformers CLIP and open_clip): candidates, tasks, the embedding
cache and `--dataset` galleries. The verdicts' side (ingest, quality control, model bias) is in
test_eccv_positives_ingest.py; the shared round is built in eccv_mitl_fixtures.py.

References are independent: the candidates are checked against a full-matrix retrieval computed
here with the models' own libraries (equal up to float near-ties); goldens are checked against the
fixture's own JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers.eccv_mitl_fixtures import ANSWERS, no_model, ranked, write_csv
from PIL import Image

from builders.app.cli import main as cli_main
from builders.engine.provenance import model_name

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


#: float32 scores summed in another order differ by ~1e-7, so two items this close may swap; a
#: wrong item is further off (and most rankings must match exactly, see below).
TOL = 1e-6


def test_candidates_equal_full_matrix_retrieval(round_dir, gallery, annotators, brute):
    data = json.loads((round_dir / "candidates.json").read_text())
    queries = data["queries"]
    assert len(queries["i2t"]) == 10 and len(queries["t2i"]) == 14
    got: dict[tuple, dict[int, int]] = {}
    for c in data["candidates"]:
        for model, rank in c["proposed_by"].items():
            got.setdefault((c["modality"], c["query_id"], model), {})[rank] = c["item_id"]
    text = dict(zip(gallery["caption_ids"], gallery["texts"], strict=True))
    position = {c: n for n, c in enumerate(gallery["caption_ids"])}
    exact = checked = 0
    # Models are recorded by their provenance names (local folders: local:NAME@sha256:...).
    assert data["config"]["models"] == [model_name(m) for m in annotators]
    assert all(m.startswith("local:") for m in data["config"]["models"])
    for model, (i2t, t2i) in brute.items():
        name = model_name(model)
        for modality, scores, rows, items in (
            ("i2t", i2t, gallery["image_ids"], gallery["caption_ids"]),
            ("t2i", t2i, gallery["caption_ids"], gallery["image_ids"]),
        ):
            for q in queries[modality]:
                score = dict(zip(items, scores[rows.index(q)], strict=True))
                expected = ranked(scores, rows.index(q), items, 5)
                mine = [got[(modality, q, name)][r] for r in sorted(got[(modality, q, name)])]
                assert sorted(got[(modality, q, name)]) == [1, 2, 3, 4, 5]
                # The same items up to float near-ties: the same score at every rank.
                assert all(abs(score[a] - score[b]) <= TOL for a, b in zip(mine, expected, strict=True)), (
                    q,
                    mine,
                    expected,
                )
                if modality == "i2t":  # copies of a caption text come in gallery order
                    for r, item in enumerate(mine):
                        twins = {c for c in items if text[c] == text[item] and position[c] < position[item]}
                        assert twins <= set(mine[:r]), (q, mine)
                exact += mine == expected
                checked += 1
    assert exact >= 0.9 * checked  # near-ties are rare, or the tolerance would hide mistakes
    # The exclusion lists are the union of both models' top-25, up to ties at the 25th score.
    for modality, scores_of, rows, items in (
        ("i2t", 0, gallery["image_ids"], gallery["caption_ids"]),
        ("t2i", 1, gallery["caption_ids"], gallery["image_ids"]),
    ):
        for q in queries[modality]:
            union, kth = set(), []
            for model in annotators:
                score = dict(zip(items, brute[model][scores_of][rows.index(q)], strict=True))
                top = ranked(brute[model][scores_of], rows.index(q), items, 25)
                union |= set(top)
                kth.append((score, score[top[-1]]))
            for item in set(data["exclude"][modality][str(q)]) ^ union:
                assert any(abs(score[item] - last) <= TOL for score, last in kth), (q, item)


def test_model_topk_breaks_ties_by_gallery_index():
    """Brute force on small-integer embeddings (exact float products, many exact ties), with
    repeated caption texts whose vectors sometimes differ (only true copies may be merged)."""
    from builders.eccv_positives.mitl.candidates import model_topk
    from builders.eccv_positives.mitl.image_gallery import Gallery

    rng = np.random.default_rng(0)
    for _ in range(100):
        n_images, n_captions = int(rng.integers(2, 12)), int(rng.integers(3, 50))
        text = rng.integers(0, rng.integers(1, n_captions + 1), n_captions)
        captions = rng.integers(-2, 3, (n_captions, 4)).astype(np.float32)[text]
        captions[rng.random(n_captions) < 0.2, 0] += 1
        images = rng.integers(-2, 3, (n_images, 4)).astype(np.float32)
        g = Gallery(
            root=Path("."),
            image_ids=list(range(n_images)),
            image_files=[""] * n_images,
            caption_ids=list(range(100, 100 + n_captions)),
            caption_image_ids=[0] * n_captions,
            captions=[f"text {t}" for t in text],
        )
        k = int(rng.integers(1, n_captions + 1))
        got = model_topk(images, captions, g, {"i2t": list(range(n_images)), "t2i": [100]}, k)
        expected = np.argsort(-(images.astype(np.float64) @ captions.T), axis=1, kind="stable")[:, :k]
        assert np.array_equal(got["i2t"], expected + 100)
        assert got["t2i"].tolist() == [ranked(captions @ images.T, 0, list(range(n_images)), k)]


def test_tasks_have_18_candidates_and_two_goldens(round_dir, gallery, brute):
    tasks = json.loads((round_dir / "tasks" / "tasks.json").read_text())["tasks"]
    data = json.loads((round_dir / "candidates.json").read_text())
    candidates = {(c["modality"], c["query_id"], c["item_id"]) for c in data["candidates"]}
    covered = set()
    for task in tasks:
        kinds = [i["kind"] for i in task["items"]]
        assert len(kinds) == 20 and kinds.count("candidate") == 18
        assert kinds.count("golden_positive") == 1 and kinds.count("golden_negative") == 1
        for item in task["items"]:
            m = item["modality"]
            pair = (m, item["query_id"], item["caption_id"] if m == "i2t" else item["image_id"])
            original = gallery["caption_image"][item["caption_id"]] == item["image_id"]
            if item["kind"] == "candidate":
                assert pair in candidates
                covered.add(pair)
            elif item["kind"] == "golden_positive":
                assert original
            else:  # in no model's top-25 (full-matrix reference) and not an original pair
                assert not original
                rows = gallery["image_ids"] if m == "i2t" else gallery["caption_ids"]
                items = gallery["caption_ids"] if m == "i2t" else gallery["image_ids"]
                for i2t, t2i in brute.values():
                    scores = i2t if m == "i2t" else t2i
                    assert pair[2] not in ranked(scores, rows.index(pair[1]), items, 25)
    assert covered == candidates


def test_task_shuffles_are_deterministic(round_dir, tmp_path):
    first = round_dir / "tasks"
    assert (
        cli_main(["eccv", "tasks", str(round_dir / "candidates.json"), "--output", str(tmp_path / "a"), "--seed", "7"])
        == 0
    )
    for name in ("label_studio_tasks.json", "tasks.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (first / name).read_bytes()
    assert (
        json.loads((tmp_path / "a" / "tasks.json").read_text())["tasks"]
        == json.loads((first / "tasks.json").read_text())["tasks"]
    )
    assert (
        cli_main(
            [
                "eccv",
                "tasks",
                str(round_dir / "candidates.json"),
                "--output",
                str(tmp_path / "b"),
                "--seed",
                "8",
                "--embed-thumbnails",
            ]
        )
        == 0
    )
    order = [[i["kind"] for i in t["items"]] for t in json.loads((first / "tasks.json").read_text())["tasks"]]
    other = [[i["kind"] for i in t["items"]] for t in json.loads((tmp_path / "b" / "tasks.json").read_text())["tasks"]]
    assert order != other
    studio = json.loads((tmp_path / "b" / "label_studio_tasks.json").read_text())
    assert len(studio) == 20 * len(order)
    assert all(t["data"]["image"].startswith("data:image/jpeg;base64,") for t in studio)
    assert all(t["predictions"][0]["result"][0]["value"]["choices"][0] in ANSWERS for t in studio)
    config = (first / "label_config.xml").read_text()
    assert all(f'"{a}"' in config for a in ANSWERS)


def test_a_model_that_cannot_load_is_a_clear_error(gallery, tmp_path, capsys):
    for model in ("/nonexistent/clip-model", "local-dir:/nonexistent/open-clip"):
        code = cli_main(
            [
                "eccv",
                "candidates",
                "--coco-root",
                str(gallery["root"]),
                "--splits",
                "test",
                "--model",
                model,
                "--image-queries",
                "2",
                "--caption-queries",
                "2",
                "--cache-dir",
                str(tmp_path),
                "--output",
                str(tmp_path / "c.json"),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and "/nonexistent/" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c.json").exists()


def test_a_dataset_gallery_gives_the_same_candidates_as_its_coco_root(gallery, annotators, tmp_path):
    """The coco-captions build of the fixture's test split, read as a plain image-caption dataset."""
    dataset = tmp_path / "coco-captions"
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(gallery["root"]),
                "--splits",
                "test",
                "--output",
                str(dataset),
            ]
        )
        == 0
    )
    # 15 test images: golden negatives can only avoid the top-5 of both models.
    common = [
        "--image-queries",
        "4",
        "--caption-queries",
        "6",
        "--seed",
        "2",
        "--batch-size",
        "1000",
        "--exclusion-depth",
        "5",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    for model in annotators:
        common += ["--model", model]
    assert (
        cli_main(
            [
                "eccv",
                "candidates",
                "--coco-root",
                str(gallery["root"]),
                "--splits",
                "test",
                *common,
                "--output",
                str(tmp_path / "coco.json"),
            ]
        )
        == 0
    )
    assert (
        cli_main(
            [
                "eccv",
                "candidates",
                "--dataset",
                str(dataset),
                "--dataset-split",
                "test",
                "--text-column",
                "captions",
                "--image-id-column",
                "image_id",
                "--caption-id-column",
                "caption_ids",
                *common,
                "--output",
                str(tmp_path / "ds.json"),
            ]
        )
        == 0
    )
    from_coco, from_dataset = (json.loads((tmp_path / f).read_text()) for f in ("coco.json", "ds.json"))
    assert from_dataset["queries"] == from_coco["queries"]
    assert from_dataset["candidates"] == from_coco["candidates"] and from_coco["candidates"]
    assert (
        cli_main(
            [
                "eccv",
                "tasks",
                str(tmp_path / "ds.json"),
                "--output",
                str(tmp_path / "tasks"),
                "--image-url-template",
                "https://example.org/{image_id}.jpg",
            ]
        )
        == 0
    )
    studio = json.loads((tmp_path / "tasks" / "label_studio_tasks.json").read_text())
    assert studio and all(t["data"]["image"].startswith("https://example.org/") for t in studio)


def test_a_dataset_gallery_keeps_its_own_ids_apart_from_coco(gallery, annotators, tmp_path):
    """A dataset's ids are its own: numbers that are COCO ids elsewhere (a shipped CxC pair, the
    paper's Appendix C.1 caption 19273 and image 578492) are neither merged nor removed, unless
    --coco-ids says they are COCO ids; the new version's card says which."""
    import datasets

    from loading_scripts.eccv import read_positives

    cxc = read_positives("cxc", None)
    cxc_image = next(iter(cxc.i2t))
    cxc_caption = int(cxc.i2t[cxc_image][0])
    image_ids = [cxc_image, 578492, *range(2, 12)]
    captions = [
        [t for c, t in zip(gallery["caption_ids"], gallery["texts"], strict=True) if gallery["caption_image"][c] == i]
        for i in gallery["image_ids"][:12]
    ]
    caption_ids = [[1000 + 10 * row + j for j in range(len(c))] for row, c in enumerate(captions)]
    caption_ids[2][0], caption_ids[3][0] = cxc_caption, 19273
    folder = tmp_path / "dataset"
    folder.mkdir()
    # Embedded: a path-only cell naming a file outside the dataset folder is never opened.
    images = [{"bytes": p.read_bytes(), "path": None} for p in gallery["paths"][:12]]
    datasets.Dataset.from_dict(
        {"image": images, "captions": captions, "image_id": image_ids, "caption_ids": caption_ids}
    ).cast_column("image", datasets.Image()).to_parquet(str(folder / "test.parquet"))
    assert (
        cli_main(
            [
                "eccv",
                "candidates",
                "--dataset",
                str(folder),
                "--text-column",
                "captions",
                "--image-id-column",
                "image_id",
                "--caption-id-column",
                "caption_ids",
                "--model",
                annotators[0],
                "--image-queries",
                "12",
                "--caption-queries",
                "0",
                "--exclusion-depth",
                "10",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--output",
                str(tmp_path / "c.json"),
            ]
        )
        == 0
    )
    assert cli_main(["eccv", "tasks", str(tmp_path / "c.json"), "--output", str(tmp_path / "tasks")]) == 0
    no_verdicts = write_csv(tmp_path / "none.csv", [])
    original = {i: set(c) for i, c in zip(image_ids, caption_ids, strict=True)}
    in_gallery = set().union(*original.values())
    as_coco = {
        i: (c | (in_gallery & set(cxc.i2t.get(i, np.empty(0)).tolist()))) - {19273}
        for i, c in original.items()
        if i != 578492
    }
    assert cxc_caption in as_coco[cxc_image]
    for flags, expected, merged in (([], original, None), (["--coco-ids"], as_coco, "shipped")):
        state = tmp_path / f"state{len(flags)}"
        assert (
            cli_main(
                [
                    "eccv",
                    "ingest",
                    str(no_verdicts),
                    "--tasks",
                    str(tmp_path / "tasks"),
                    "--state",
                    str(state),
                    *flags,
                    "--output",
                    str(state / "version"),
                ]
            )
            == 0
        )
        report = json.loads((state / "annotations" / "mitl_report.json").read_text())
        assert (report["gallery"], report["cxc_merged"], report["appendix_c1_removal"]) == (
            "dataset",
            merged,
            bool(flags),
        )
        positives = json.loads((state / "annotations" / "eccv_image_to_caption.json").read_text())
        assert {int(i): set(c) for i, c in positives.items()} == expected
        # The new version's card says what the report says happened.
        card = (state / "version" / "README.md").read_text()
        if flags:
            said = (
                f"verified pairs; removed invalid captions: {report['removed_invalid']}; merged with CxC "
                "(the pairs shipped with `eccv_caption`) and the original dataset pairs."
            )
        else:
            said = (
                "verified pairs; Appendix C.1 removal skipped (its ids are COCO ids, the gallery's are "
                "its own); CxC not merged (its ids are COCO ids); merged with the original dataset pairs."
            )
        assert said in card and ("merged with CxC" in card) == bool(flags)
        assert "positives of an image-caption dataset" in card and "COCO retrieval" not in card
        assert ("and CrissCrossed Captions" in card) == bool(flags)


def test_embedding_cache_is_reused_until_the_weights_or_images_change(gallery, annotators, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from builders.eccv_positives.mitl import embeddings
    from builders.eccv_positives.mitl.image_gallery import Gallery
    from builders.models import clip

    model, root, cache = tmp_path / "clip", tmp_path / "coco", tmp_path / "cache"
    shutil.copytree(annotators[0], model)
    shutil.copytree(gallery["root"], root)
    g = Gallery.from_coco(root, ("test",))
    images, captions = embeddings.gallery_embeddings(str(model), g, cache)
    real_loader = clip.load_scorer
    monkeypatch.setattr(clip, "load_scorer", no_model)
    again = embeddings.gallery_embeddings(str(model), g, cache)
    assert np.array_equal(again[0], images) and np.array_equal(again[1], captions)
    assert isinstance(again[1], np.memmap)  # read memory-mapped, as benchmarks/eccv_candidates.py does

    def rewritten(path: Path) -> None:
        # A retrain or re-download writes later; shown even where timestamps are coarse.
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    weights = model / "model.safetensors"
    state = load_file(weights)
    name = next(n for n in state if "text_projection" in n)
    state[name] = state[name] * 2 + 0.1  # "retrained": same file, same size, new values
    save_file(state, weights, metadata={"format": "pt"})
    rewritten(weights)
    with pytest.raises(AssertionError, match="although its embeddings are cached"):
        embeddings.gallery_embeddings(str(model), g, cache)
    monkeypatch.setattr(clip, "load_scorer", real_loader)
    new_images, new_captions = embeddings.gallery_embeddings(str(model), g, cache)
    assert np.array_equal(new_images, images) and not np.allclose(new_captions, captions)
    # An image replaced in place invalidates the entry too.
    monkeypatch.setattr(clip, "load_scorer", no_model)
    Image.new("RGB", (64, 48), "red").save(root / g.image_files[0])
    rewritten(root / g.image_files[0])
    with pytest.raises(AssertionError, match="although its embeddings are cached"):
        embeddings.gallery_embeddings(str(model), g, cache)


def test_a_model_of_another_family_is_refused_in_one_line_before_any_data_is_read(tmp_path, capsys):
    """A BERT folder (or a FLAVA head that scores no pair, its image tower `FlavaImageModel`) was loaded
    into a random-init CLIP; now one line names it, the type found and the families accepted. The
    gallery given does not exist: the refusal comes before it is read."""
    configs = {"bert": ("bert", "BertModel"), "flava": ("flava", "FlavaImageModel")}
    for folder, (model_type, architecture) in configs.items():
        (tmp_path / folder).mkdir()
        config = {"model_type": model_type, "architectures": [architecture]}
        (tmp_path / folder / "config.json").write_text(json.dumps(config))
    for model, found in ((tmp_path / "bert", "'bert'"), (tmp_path / "flava", "FlavaImageModel")):
        code = cli_main(
            ["eccv", "candidates", "--coco-root", str(tmp_path / "no-coco"), "--model", str(model)]
            + ["--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "c.json")]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert str(model) in err and found in err and "CLIP" in err and "no-coco" not in err, err
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "cache").exists()


def test_a_vilt_annotator_proposes_its_own_itm_ranking(gallery, annotators, tiny_families_dir, tmp_path):
    """ViLT, a cross-encoder, annotates by re-ranking the first stage's top --rerank-k by its ITM
    logit; with --rerank-k the gallery size its proposals are its full ranking, computed here with
    transformers' own ViLT calls (`logits[:, 0]`), ties to the lower gallery index."""
    import torch
    from transformers import ViltForImageAndTextRetrieval, ViltProcessor

    vilt = str(tiny_families_dir / "vilt")
    out = tmp_path / "c.json"
    args = ["eccv", "candidates", "--coco-root", str(gallery["root"]), "--splits", "train", "restval", "val", "test"]
    args += ["--image-queries", "2", "--caption-queries", "2", "--seed", "3", "--model", vilt]
    args += ["--first-stage", annotators[0], "--rerank-k", "100000", "--cache-dir", str(tmp_path / "cache")]
    assert cli_main([*args, "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    name = model_name(vilt)
    assert data["config"]["rerankers"][name] == {
        "architecture": "ViltForImageAndTextRetrieval",
        "method": "first_stage_top_k_reranked_by_itm",
        "k": 100000,
        "first_stage": model_name(annotators[0]),
        "g": "vilt_itm_logit",
    }
    got: dict[tuple, dict[int, int]] = {}
    for c in data["candidates"]:
        got.setdefault((c["modality"], c["query_id"]), {})[c["proposed_by"][name]] = c["item_id"]
    model, proc = ViltForImageAndTextRetrieval.from_pretrained(vilt).eval(), ViltProcessor.from_pretrained(vilt)
    images = [Image.open(p).convert("RGB") for p in gallery["paths"]]

    def g(imgs, texts):
        with torch.no_grad():
            x = proc(images=imgs, text=texts, return_tensors="pt", padding=True, truncation=True)
            return model(**x).logits[:, 0].numpy()

    checked = 0
    for modality in ("i2t", "t2i"):
        for q in data["queries"][modality]:
            if modality == "i2t":
                items, i = gallery["caption_ids"], gallery["image_ids"].index(q)
                scores = g([images[i]] * len(items), gallery["texts"])
            else:
                items, t = gallery["image_ids"], gallery["texts"][gallery["caption_ids"].index(q)]
                scores = g(images, [t] * len(items))
            expected = [items[j] for j in np.lexsort((np.arange(len(items)), -scores))[:5]]
            mine = [got[(modality, q)][r] for r in sorted(got[(modality, q)])]
            score = dict(zip(items, scores, strict=True))
            assert len(mine) == 5 and all(
                abs(score[a] - score[b]) <= 1e-5 for a, b in zip(mine, expected, strict=True)
            ), (q, mine)
            checked += 1
    assert checked == 4
