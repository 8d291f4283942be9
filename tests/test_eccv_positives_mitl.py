"""A machine-in-the-loop round with the `counterfactory eccv` commands, on a fixture gallery and
two tiny machine annotators (transformers CLIP and open_clip).

References are independent: the candidates are checked against a full-matrix retrieval computed
here with the models' own libraries; the simulated annotation has a hidden ground truth; goldens
are checked against the fixture's own JSON.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_dataset
from PIL import Image

from builders.infra.cli import main as cli_main

ANSWERS = ("100% YES", "Partially YES, but", "Mostly NO, because", "100% NO")
YES, NO = ANSWERS[:2], ANSWERS[2:]


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    """A 60-image COCO fixture; the gallery is all of it (all Karpathy splits)."""
    from builders.infra.fixtures.coco import CocoFixtureConfig, write_coco_fixture

    root = tmp_path_factory.mktemp("mitl") / "coco"
    write_coco_fixture(root, CocoFixtureConfig(n_images=60, seed=5))
    images, captions = {}, []
    for split in ("train2014", "val2014"):
        data = json.loads((root / "annotations" / f"captions_{split}.json").read_text())
        images.update({im["id"]: root / split / im["file_name"] for im in data["images"]})
        captions += [(a["image_id"], a["id"], a["caption"].strip()) for a in data["annotations"]]
    captions.sort()
    return {"root": root, "image_ids": sorted(images), "paths": [images[i] for i in sorted(images)],
            "caption_ids": [c for _, c, _ in captions], "caption_image": {c: i for i, c, _ in captions},
            "texts": [t for _, _, t in captions]}


@pytest.fixture(scope="module")
def annotators(tiny_models_dir):
    from builders.infra.models.tiny import build_tiny_models

    paths = build_tiny_models(tiny_models_dir)
    return [str(paths["clip"]), f"local-dir:{paths['open_clip']}"]


def brute_force_scores(model_id: str, gallery) -> tuple[np.ndarray, np.ndarray]:
    """Full [images x captions] similarity with each library's documented calls, one batch."""
    images = [Image.open(p).convert("RGB") for p in gallery["paths"]]
    with torch.no_grad():
        if model_id.startswith("local-dir:"):
            import open_clip

            model, _, preprocess = open_clip.create_model_and_transforms(model_id)
            model.eval()
            img = model.encode_image(torch.stack([preprocess(im) for im in images]))
            txt = model.encode_text(open_clip.get_tokenizer(model_id)(gallery["texts"]))
        else:
            from transformers import CLIPModel, CLIPProcessor

            model, proc = CLIPModel.from_pretrained(model_id).eval(), CLIPProcessor.from_pretrained(model_id)
            img = model.get_image_features(pixel_values=proc(images=images, return_tensors="pt")["pixel_values"])
            txt = model.get_text_features(**proc(text=gallery["texts"], return_tensors="pt", padding=True,
                                                 truncation=True))
            img, txt = (getattr(x, "pooler_output", x) for x in (img, txt))
    img = torch.nn.functional.normalize(img.float(), dim=-1)
    txt = torch.nn.functional.normalize(txt.float(), dim=-1)
    return (img @ txt.T).numpy(), (txt @ img.T).numpy()


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory, gallery, annotators):
    run = tmp_path_factory.mktemp("round")
    args = ["eccv", "candidates", "--coco-root", str(gallery["root"]), "--splits", "train", "restval",
            "val", "test", "--image-queries", "10", "--caption-queries", "14", "--seed", "1",
            "--batch-size", "1000", "--cache-dir", str(run / "cache"), "--output", str(run / "candidates.json")]
    for model in annotators:
        args += ["--model", model]
    assert cli_main(args) == 0
    assert cli_main(["eccv", "tasks", str(run / "candidates.json"), "--output", str(run / "tasks"),
                     "--seed", "7"]) == 0
    return run


@pytest.fixture(scope="module")
def brute(gallery, annotators):
    return {m: brute_force_scores(m, gallery) for m in annotators}


def ranked(scores: np.ndarray, row: int, ids: list[int], k: int) -> list[int]:
    return [ids[j] for j in np.argsort(-scores[row], kind="stable")[:k]]


def test_candidates_equal_full_matrix_retrieval(round_dir, gallery, annotators, brute):
    data = json.loads((round_dir / "candidates.json").read_text())
    queries = data["queries"]
    assert len(queries["i2t"]) == 10 and len(queries["t2i"]) == 14
    expected: dict[tuple, dict[str, int]] = {}
    for model, (i2t, t2i) in brute.items():
        for modality, scores, rows, items in (("i2t", i2t, gallery["image_ids"], gallery["caption_ids"]),
                                              ("t2i", t2i, gallery["caption_ids"], gallery["image_ids"])):
            for q in queries[modality]:
                top = ranked(scores, rows.index(q), items, 25)
                for rank, item in enumerate(top[:5], start=1):
                    expected.setdefault((modality, q, item), {})[model] = rank
    got = {(c["modality"], c["query_id"], c["item_id"]): c["proposed_by"] for c in data["candidates"]}
    assert got == expected
    # The exclusion lists are the union of both models' top-25.
    for modality, scores_of, rows, items in (("i2t", 0, gallery["image_ids"], gallery["caption_ids"]),
                                             ("t2i", 1, gallery["caption_ids"], gallery["image_ids"])):
        for q in queries[modality]:
            union = set()
            for model in annotators:
                union |= set(ranked(brute[model][scores_of], rows.index(q), items, 25))
            assert set(data["exclude"][modality][str(q)]) == union


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
    assert cli_main(["eccv", "tasks", str(round_dir / "candidates.json"), "--output", str(tmp_path / "a"),
                     "--seed", "7"]) == 0
    for name in ("label_studio_tasks.json", "tasks.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (first / name).read_bytes()
    assert json.loads((tmp_path / "a" / "tasks.json").read_text())["tasks"] == \
        json.loads((first / "tasks.json").read_text())["tasks"]
    assert cli_main(["eccv", "tasks", str(round_dir / "candidates.json"), "--output", str(tmp_path / "b"),
                     "--seed", "8", "--embed-thumbnails"]) == 0
    order = [[i["kind"] for i in t["items"]] for t in json.loads((first / "tasks.json").read_text())["tasks"]]
    other = [[i["kind"] for i in t["items"]]
             for t in json.loads((tmp_path / "b" / "tasks.json").read_text())["tasks"]]
    assert order != other
    studio = json.loads((tmp_path / "b" / "label_studio_tasks.json").read_text())
    assert len(studio) == 20 * len(order)
    assert all(t["data"]["image"].startswith("data:image/jpeg;base64,") for t in studio)
    assert all(t["predictions"][0]["result"][0]["value"]["choices"][0] in ANSWERS for t in studio)
    config = (first / "label_config.xml").read_text()
    assert all(f'"{a}"' in config for a in ANSWERS)


# ----------------------------------------------------------------------------- simulated annotation

def truth(item, gallery) -> bool:
    """Hidden ground truth: original pairs are positive, golden negatives (outside every model's
    top-25) negative, other pairs positive with probability 0.4."""
    if gallery["caption_image"][item["caption_id"]] == item["image_id"]:
        return True
    if item["kind"] == "golden_negative":
        return False
    return random.Random(f"{item['image_id']}-{item['caption_id']}").random() < 0.4


def good_answer(item, gallery, rng: random.Random) -> str:
    if rng.random() < 0.05:  # 5% noise: a random answer
        return rng.choice(ANSWERS)
    return rng.choice(YES if truth(item, gallery) else NO)


def spam_answer(item, rng: random.Random) -> str:
    if item["kind"] == "golden_positive":
        return "100% NO"
    if item["kind"] == "golden_negative":
        return "100% YES"
    return rng.choice(ANSWERS)


def failed_golden(answers: dict[str, str], task) -> bool:
    for item in task["items"]:
        if item["kind"] == "golden_positive" and answers[item["item_id"]] not in YES:
            return True
        if item["kind"] == "golden_negative" and answers[item["item_id"]] not in NO:
            return True
    return False


def write_csv(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task_id", "item_id", "worker_id", "answer"])
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def simulation(round_dir, gallery):
    """5 good workers answer every task, 2 spammers every other one. Even tasks' good answers go
    to a Label Studio export, odd ones to a CSV, the spammers to their own CSV."""
    tasks = json.loads((round_dir / "tasks" / "tasks.json").read_text())["tasks"]
    studio = {t["data"]["item_id"]: t
              for t in json.loads((round_dir / "tasks" / "label_studio_tasks.json").read_text())}
    rng = random.Random(11)
    export, good_rows, spam_rows, submissions = [], [], [], []
    for n, task in enumerate(tasks):
        workers = [f"good{w}" for w in range(5)] + ([f"spam{n // 2 % 2}"] if n % 2 == 0 else [])
        for worker in workers:
            answers = {i["item_id"]: (spam_answer(i, rng) if worker.startswith("spam")
                                      else good_answer(i, gallery, rng)) for i in task["items"]}
            submissions.append({"task": task, "worker": worker, "answers": answers,
                                "failed": failed_golden(answers, task)})
            for item_id, answer in answers.items():
                row = (task["task_id"], item_id, worker, answer)
                if worker.startswith("spam"):
                    spam_rows.append(row)
                elif n % 2:
                    good_rows.append(row)
                else:
                    entry = dict(studio[item_id]) if item_id not in {e["data"]["item_id"] for e in export} else None
                    target = entry or next(e for e in export if e["data"]["item_id"] == item_id)
                    target.setdefault("annotations", []).append({
                        "completed_by": {"id": worker}, "was_cancelled": False,
                        "result": [{"from_name": "answer", "to_name": "text", "type": "choices",
                                    "value": {"choices": [answer]}}]})
                    if entry:
                        export.append(entry)
    files = round_dir / "verdicts"
    files.mkdir()
    (files / "export.json").write_text(json.dumps(export))
    return {"tasks": tasks, "submissions": submissions,
            "files": [files / "export.json", write_csv(files / "good.csv", good_rows),
                      write_csv(files / "spam.csv", spam_rows)]}


@pytest.fixture(scope="module")
def ingested(round_dir, simulation, local_hub):
    """Ingest, build and publish the new version to the local Hub in one command."""
    out = round_dir / "v2"
    assert cli_main(["eccv", "ingest", *map(str, simulation["files"]), "--tasks", str(round_dir / "tasks"),
                     "--state", str(round_dir / "state"), "--output", str(out),
                     "--repo-id", "tester/eccv-mitl", "--version", "v2.0.0"]) == 0
    return out


def test_new_version_loads_at_its_tag(ingested):
    for config in ("i2t", "t2i"):
        remote = load_dataset("tester/eccv-mitl", config, split="test", revision="v2.0.0")
        local = load_dataset(str(ingested), config, split="test")
        columns = [c for c in local.column_names if c != "image"]
        assert remote.select_columns(columns).to_list() == local.select_columns(columns).to_list()
        assert sum(local["eccv_query"]) == (14 if config == "t2i" else 10)  # the sampled queries


def test_ingest_recovers_the_ground_truth_and_excludes_spammers(ingested, round_dir, simulation, gallery):
    report = json.loads((round_dir / "state" / "annotations" / "mitl_report.json").read_text())
    failed = set(report["failed_submissions"])
    spam = {f"{s['task']['task_id']}/{s['worker']}" for s in simulation["submissions"]
            if s["worker"].startswith("spam")}
    assert spam and spam <= failed
    assert failed == {f"{s['task']['task_id']}/{s['worker']}" for s in simulation["submissions"] if s["failed"]}

    positives = {("i2t", r["image_id"]): set(r["positive_caption_ids"])
                 for r in load_dataset(str(ingested), "i2t", split="test") if r["eccv_query"]}
    positives |= {("t2i", r["caption_id"]): set(r["positive_image_ids"])
                  for r in load_dataset(str(ingested), "t2i", split="test") if r["eccv_query"]}
    checked = 0
    for sub in simulation["submissions"]:
        if sub["failed"]:
            continue
        for item in sub["task"]["items"]:
            if item["kind"] != "candidate":
                continue
            m = item["modality"]
            other = item["caption_id"] if m == "i2t" else item["image_id"]
            assert (other in positives.get((m, item["query_id"]), set())) == truth(item, gallery), item
            checked += 1
    assert checked > 200
    # Every sampled query keeps its original COCO pairs (merged in).
    for (m, q), pos in positives.items():
        if m == "t2i":
            assert gallery["caption_image"][q] in pos
        else:
            assert {c for c, i in gallery["caption_image"].items() if i == q} <= pos


def test_card_counts_match_the_simulation(ingested, simulation):
    card = (ingested / "README.md").read_text()
    n_failed = sum(s["failed"] for s in simulation["submissions"])
    assert f"task submissions: {len(simulation['submissions'])};" in card
    assert f"failing a golden item: {n_failed} (excluded)" in card
    for worker in ("spam0", "spam1"):
        n = sum(s["worker"] == worker for s in simulation["submissions"])
        assert f"| {worker} | {n} | {n} |" in card


# ----------------------------------------------------------------------------- bad input

def state_snapshot(round_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(round_dir).as_posix(): p.read_bytes()
            for p in sorted((round_dir / "state").rglob("*")) if p.is_file()}


def a_submission(task, worker: str, answer: str = "100% YES") -> list[tuple[str, str, str, str]]:
    return [(task["task_id"], i["item_id"], worker, answer) for i in task["items"]]


def test_bad_verdicts_are_clear_errors_and_lose_nothing(ingested, round_dir, simulation, tmp_path, capsys):
    tasks = simulation["tasks"]
    before = state_snapshot(round_dir)
    good = write_csv(tmp_path / "new_worker.csv", a_submission(tasks[1], "fresh"))
    unknown_task = write_csv(tmp_path / "unknown_task.csv",
                             a_submission(tasks[0], "w9")[:3] + [("i2t-99999", "i2t-99999-00", "w9", "100% NO")])
    unknown_item = write_csv(tmp_path / "unknown_item.csv",
                             [(tasks[0]["task_id"], f"{tasks[0]['task_id']}-77", "w9", "100% NO")])
    twice = write_csv(tmp_path / "twice.csv", a_submission(tasks[2], "good0", "100% NO"))
    malformed = tmp_path / "export.json"
    malformed.write_text(json.dumps([{"data": {"task_id": "x"}}])[:-5])
    expected = {unknown_task: ("row 5", "unknown task id"), unknown_item: ("row 2", "unknown item id"),
                twice: ("row 2", "already answered by worker good0"),
                malformed: ("malformed JSON at line 1", "")}
    for bad, (where, what) in expected.items():
        # A valid file in the same call is not stored either: a call is all or nothing.
        code = cli_main(["eccv", "ingest", str(good), str(bad), "--tasks", str(round_dir / "tasks"),
                         "--state", str(round_dir / "state")])
        err = capsys.readouterr().err
        assert code == 2 and str(bad) in err and where in err and what in err, err
        assert len(err.strip().splitlines()) == 1
        assert state_snapshot(round_dir) == before


def test_a_model_that_cannot_load_is_a_clear_error(gallery, tmp_path, capsys):
    for model in ("/nonexistent/clip-model", "local-dir:/nonexistent/open-clip"):
        code = cli_main(["eccv", "candidates", "--coco-root", str(gallery["root"]), "--splits", "test",
                         "--model", model, "--image-queries", "2", "--caption-queries", "2",
                         "--cache-dir", str(tmp_path), "--output", str(tmp_path / "c.json")])
        err = capsys.readouterr().err
        assert code == 2 and "/nonexistent/" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c.json").exists()


# ----------------------------------------------------------------------------- model bias

def map_at_r(ranking: list[int], positives: set[int]) -> float:
    """mAP@R of one query, straight from its definition (Musgrave et al., 2020)."""
    r = len(positives)
    hits = 0
    total = 0.0
    for n, item in enumerate(ranking[:r], start=1):
        if item in positives:
            hits += 1
            total += hits / n
    return total / r


def test_model_bias_ranks_models_on_single_annotator_sets(ingested, round_dir, simulation, gallery,
                                                          annotators, brute, capsys):
    out = round_dir / "bias"
    assert cli_main(["eccv", "model-bias", "--tasks", str(round_dir / "tasks"), "--state",
                     str(round_dir / "state"), "--output", str(out)]) == 0
    assert "mAP@R" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "model_bias.csv")))
    assert {(r["model"], r["annotation_set"]) for r in rows} == \
        {(m, s) for m in annotators for s in [*annotators, "all"]}
    assert (out / "model_bias.png").stat().st_size > 0
    # Reference: the verified pairs are the ground truth (previous test); a single annotator's
    # set keeps the positives it proposed.
    proposed = {(c["modality"], c["query_id"], c["item_id"]): c["proposed_by"] for c in
                json.loads((round_dir / "candidates.json").read_text())["candidates"]}
    verified = {(i["modality"], i["query_id"], i["caption_id"] if i["modality"] == "i2t" else i["image_id"]): i
                for s in simulation["submissions"] if not s["failed"]
                for i in s["task"]["items"] if i["kind"] == "candidate"}
    for row in rows:
        m, set_name, model = row["modality"], row["annotation_set"], row["model"]
        positives: dict[int, set[int]] = {}
        for pair, item in verified.items():
            if pair[0] == m and truth(item, gallery) and (set_name == "all" or set_name in proposed[pair]):
                positives.setdefault(pair[1], set()).add(pair[2])
        scores = brute[model][0 if m == "i2t" else 1]
        rows_ids = gallery["image_ids"] if m == "i2t" else gallery["caption_ids"]
        items = gallery["caption_ids"] if m == "i2t" else gallery["image_ids"]
        expected = np.mean([map_at_r(ranked(scores, rows_ids.index(q), items, len(items)), pos)
                            for q, pos in sorted(positives.items())])
        assert int(row["queries"]) == len(positives)
        assert float(row["map_at_r"]) == pytest.approx(expected, abs=1e-9)


def test_a_dataset_gallery_gives_the_same_candidates_as_its_coco_root(gallery, annotators, tmp_path):
    """The coco-captions build of the fixture's test split, read as a plain image-caption dataset."""
    dataset = tmp_path / "coco-captions"
    assert cli_main(["build", "coco-captions", "--coco-root", str(gallery["root"]), "--splits", "test",
                     "--output", str(dataset)]) == 0
    # 15 test images: golden negatives can only avoid the top-5 of both models.
    common = ["--image-queries", "4", "--caption-queries", "6", "--seed", "2", "--batch-size", "1000",
              "--exclusion-depth", "5", "--cache-dir", str(tmp_path / "cache")]
    for model in annotators:
        common += ["--model", model]
    assert cli_main(["eccv", "candidates", "--coco-root", str(gallery["root"]), "--splits", "test",
                     *common, "--output", str(tmp_path / "coco.json")]) == 0
    assert cli_main(["eccv", "candidates", "--dataset", str(dataset), "--dataset-split", "test",
                     "--text-column", "captions", "--image-id-column", "image_id",
                     "--caption-id-column", "caption_ids", *common, "--output", str(tmp_path / "ds.json")]) == 0
    from_coco, from_dataset = (json.loads((tmp_path / f).read_text()) for f in ("coco.json", "ds.json"))
    assert from_dataset["queries"] == from_coco["queries"]
    assert from_dataset["candidates"] == from_coco["candidates"] and from_coco["candidates"]
    assert cli_main(["eccv", "tasks", str(tmp_path / "ds.json"), "--output", str(tmp_path / "tasks"),
                     "--image-url-template", "https://example.org/{image_id}.jpg"]) == 0
    studio = json.loads((tmp_path / "tasks" / "label_studio_tasks.json").read_text())
    assert studio and all(t["data"]["image"].startswith("https://example.org/") for t in studio)


def test_cxc_ratings_are_merged_above_the_threshold(round_dir, simulation, gallery, tmp_path):
    """CxC's SITS rows for gallery pairs: those scoring >= 3 join the positives, the others not."""
    tasks = json.loads((round_dir / "tasks" / "tasks.json").read_text())
    image = tasks["queries"]["i2t"][0]
    caption = next(c for c, i in gallery["caption_image"].items() if i != image)
    low = next(c for c, i in gallery["caption_image"].items() if i != image and c != caption)
    sits = tmp_path / "sits_test.csv"
    sits.write_text("caption,image,agg_score,sampling_method\n"
                    f"COCO_val2014:sentid:{caption},COCO_val2014_{image:012d}.jpg,3.4,c2i_intrasim\n"
                    f"COCO_val2014:sentid:{low},COCO_val2014_{image:012d}.jpg,2.9,c2i_intrasim\n")
    out = tmp_path / "v3"
    assert cli_main(["eccv", "ingest", str(simulation["files"][0]), "--tasks", str(round_dir / "tasks"),
                     "--state", str(tmp_path / "state"), "--cxc-sits", str(sits), "--output", str(out)]) == 0
    rows = {r["image_id"]: r for r in load_dataset(str(out), "i2t", split="test")}
    assert rows[image]["cxc_caption_ids"] == [caption]
    assert caption in rows[image]["positive_caption_ids"]
    assert "cxc" in rows[image]["positive_sources"]
    assert "pairs scoring ≥ 3.0 in" in (out / "README.md").read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text("caption,image,agg_score,sampling_method\nCOCO_val2014:sentid:x,img.jpg,3,y\n")
    assert cli_main(["eccv", "ingest", str(simulation["files"][0]), "--tasks", str(round_dir / "tasks"),
                     "--state", str(tmp_path / "state2"), "--cxc-sits", str(bad)]) == 2
    assert not (tmp_path / "state2" / "verdicts.json").exists()  # a failed call stores nothing


def test_strict_keeps_only_full_yes_majorities(round_dir, simulation, gallery, tmp_path):
    out = tmp_path / "strict"
    assert cli_main(["eccv", "ingest", str(simulation["files"][0]), "--tasks", str(round_dir / "tasks"),
                     "--state", str(tmp_path / "state"), "--strict", "--output", str(out)]) == 0
    exported = {t["task_id"] for t in simulation["tasks"][::2]}  # good workers' even tasks
    votes: dict[tuple, list[bool]] = {}
    for sub in simulation["submissions"]:
        if sub["failed"] or sub["worker"].startswith("spam") or sub["task"]["task_id"] not in exported:
            continue
        for item in sub["task"]["items"]:
            if item["kind"] == "candidate":
                m = item["modality"]
                pair = (m, item["query_id"], item["caption_id"] if m == "i2t" else item["image_id"])
                votes.setdefault(pair, []).append(sub["answers"][item["item_id"]] == "100% YES")
    assert votes
    rows = {("i2t", r["image_id"]): set(r["positive_caption_ids"])
            for r in load_dataset(str(out), "i2t", split="test") if r["eccv_query"]}
    rows |= {("t2i", r["caption_id"]): set(r["positive_image_ids"])
             for r in load_dataset(str(out), "t2i", split="test") if r["eccv_query"]}
    for (m, q, other), v in votes.items():
        original = (gallery["caption_image"][other] == q) if m == "i2t" else (gallery["caption_image"][q] == other)
        expected = original or sum(v) > len(v) - sum(v)
        assert (other in rows.get((m, q), set())) == expected
