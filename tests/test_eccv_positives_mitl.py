"""A machine-in-the-loop round with the `counterfactory eccv` commands, on a fixture gallery and
two tiny machine annotators (transformers CLIP and open_clip).

References are independent: the candidates are checked against a full-matrix retrieval computed
here with the models' own libraries (equal up to float near-ties); the simulated annotation has a
hidden ground truth; goldens are checked against the fixture's own JSON.
"""

from __future__ import annotations

import csv
import json
import os
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
    # A caption text repeated in the gallery is one model input, so one score: its copies tie
    # exactly and rank by gallery index (METHOD.md §2), whatever rounding the product gives them.
    first: dict[str, int] = {}
    same = [first.setdefault(t, n) for n, t in enumerate(gallery["texts"])]
    return (img @ txt.T).numpy()[:, same], (txt @ img.T).numpy()[same]


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
    text = dict(zip(gallery["caption_ids"], gallery["texts"]))
    position = {c: n for n, c in enumerate(gallery["caption_ids"])}
    exact = checked = 0
    for model, (i2t, t2i) in brute.items():
        for modality, scores, rows, items in (("i2t", i2t, gallery["image_ids"], gallery["caption_ids"]),
                                              ("t2i", t2i, gallery["caption_ids"], gallery["image_ids"])):
            for q in queries[modality]:
                score = dict(zip(items, scores[rows.index(q)]))
                expected = ranked(scores, rows.index(q), items, 5)
                mine = [got[(modality, q, model)][r] for r in sorted(got[(modality, q, model)])]
                assert sorted(got[(modality, q, model)]) == [1, 2, 3, 4, 5]
                # The same items up to float near-ties: the same score at every rank.
                assert all(abs(score[a] - score[b]) <= TOL for a, b in zip(mine, expected)), (q, mine, expected)
                if modality == "i2t":  # copies of a caption text come in gallery order
                    for r, item in enumerate(mine):
                        twins = {c for c in items if text[c] == text[item] and position[c] < position[item]}
                        assert twins <= set(mine[:r]), (q, mine)
                exact += mine == expected
                checked += 1
    assert exact >= 0.9 * checked  # near-ties are rare, or the tolerance would hide mistakes
    # The exclusion lists are the union of both models' top-25, up to ties at the 25th score.
    for modality, scores_of, rows, items in (("i2t", 0, gallery["image_ids"], gallery["caption_ids"]),
                                             ("t2i", 1, gallery["caption_ids"], gallery["image_ids"])):
        for q in queries[modality]:
            union, kth = set(), []
            for model in annotators:
                score = dict(zip(items, brute[model][scores_of][rows.index(q)]))
                top = ranked(brute[model][scores_of], rows.index(q), items, 25)
                union |= set(top)
                kth.append((score, score[top[-1]]))
            for item in set(data["exclude"][modality][str(q)]) ^ union:
                assert any(abs(score[item] - last) <= TOL for score, last in kth), (q, item)


def test_model_topk_breaks_ties_by_gallery_index():
    """Brute force on small-integer embeddings (exact float products, many exact ties), with
    repeated caption texts whose vectors sometimes differ (only true copies may be merged)."""
    from builders.eccv_positives.candidates import model_topk
    from builders.eccv_positives.gallery import Gallery

    rng = np.random.default_rng(0)
    for _ in range(100):
        n_images, n_captions = int(rng.integers(2, 12)), int(rng.integers(3, 50))
        text = rng.integers(0, rng.integers(1, n_captions + 1), n_captions)
        captions = rng.integers(-2, 3, (n_captions, 4)).astype(np.float32)[text]
        captions[rng.random(n_captions) < 0.2, 0] += 1
        images = rng.integers(-2, 3, (n_images, 4)).astype(np.float32)
        g = Gallery(root=Path("."), image_ids=list(range(n_images)), image_files=[""] * n_images,
                    caption_ids=list(range(100, 100 + n_captions)), caption_image_ids=[0] * n_captions,
                    captions=[f"text {t}" for t in text])
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


def spam_answer(item, rng: random.Random, worker: str) -> str:
    if worker.startswith("spam-yes"):  # accepts the pre-selected machine answer everywhere
        return "100% YES"
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
    """5 good workers answer every task, 2 spammers every other one, and every fourth task gets a
    spam majority (6 workers saying "100% YES" to everything). Even tasks' good answers go to a
    Label Studio export, odd ones to a CSV, the spammers to their own CSV."""
    tasks = json.loads((round_dir / "tasks" / "tasks.json").read_text())["tasks"]
    studio = {t["data"]["item_id"]: t
              for t in json.loads((round_dir / "tasks" / "label_studio_tasks.json").read_text())}
    rng = random.Random(11)
    export, good_rows, spam_rows, submissions = [], [], [], []
    for n, task in enumerate(tasks):
        workers = [f"good{w}" for w in range(5)] + ([f"spam{n // 2 % 2}"] if n % 2 == 0 else [])
        workers += [f"spam-yes{w}" for w in range(6)] if n % 4 == 1 else []
        for worker in workers:
            answers = {i["item_id"]: (spam_answer(i, rng, worker) if worker.startswith("spam")
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
    for worker in {s["worker"] for s in simulation["submissions"] if s["worker"].startswith("spam")}:
        n = sum(s["worker"] == worker for s in simulation["submissions"])
        assert f"| {worker} | {n} | {n} |" in card


def test_spam_majorities_count_only_with_keep_failed_golden(ingested, round_dir, simulation, tmp_path):
    assert any(s["worker"].startswith("spam-yes") for s in simulation["submissions"])
    assert cli_main(["eccv", "ingest", *map(str, simulation["files"]), "--tasks", str(round_dir / "tasks"),
                     "--state", str(tmp_path / "state"), "--keep-failed-golden"]) == 0
    kept = json.loads((tmp_path / "state" / "annotations" / "mitl_report.json").read_text())
    votes: dict[tuple, list[bool]] = {}  # every submission's verdicts, failed goldens included
    for sub in simulation["submissions"]:
        for item in sub["task"]["items"]:
            if item["kind"] == "candidate":
                m = item["modality"]
                pair = (m, item["query_id"], item["caption_id"] if m == "i2t" else item["image_id"])
                votes.setdefault(pair, []).append(sub["answers"][item["item_id"]] in YES)
    assert kept["human_positive_pairs"] == sorted([*p] for p, v in votes.items() if 2 * sum(v) > len(v))
    # The default ingest (checked against the ground truth above) drops what the spam majority adds.
    default = json.loads((round_dir / "state" / "annotations" / "mitl_report.json").read_text())
    assert set(map(tuple, default["human_positive_pairs"])) < set(map(tuple, kept["human_positive_pairs"]))


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


def studio_export(round_dir: Path, answers: list[tuple[str, str]]) -> list[dict]:
    """A Label Studio export of "100% YES" answers, given as (item id, worker) pairs."""
    studio = {t["data"]["item_id"]: t
              for t in json.loads((round_dir / "tasks" / "label_studio_tasks.json").read_text())}
    export: dict[str, dict] = {}
    for item_id, worker in answers:
        export.setdefault(item_id, dict(studio[item_id], annotations=[]))["annotations"].append({
            "completed_by": {"id": worker}, "was_cancelled": False,
            "result": [{"from_name": "answer", "to_name": "text", "type": "choices",
                        "value": {"choices": ["100% YES"]}}]})
    return list(export.values())


def test_incomplete_submissions_are_counted_skips(round_dir, simulation, tmp_path):
    """Label Studio shows each pair as its own task: an export holds half-done 20-item tasks."""
    t0, t1 = simulation["tasks"][:2]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(studio_export(round_dir, [(i["item_id"], "p1") for i in t0["items"][:7]]
                                                + [(i["item_id"], "p2") for i in t1["items"]]
                                                + [(i["item_id"], "p3") for i in t1["items"][1:]])))
    args = ["--tasks", str(round_dir / "tasks"), "--state", str(tmp_path / "state")]
    assert cli_main(["eccv", "ingest", str(partial), *args]) == 0
    report_path = tmp_path / "state" / "annotations" / "mitl_report.json"
    report = json.loads(report_path.read_text())
    assert (report["submissions"], report["incomplete_submissions"]) == (1, 2)
    assert report["per_worker"]["p1"] == {"submissions": 0, "failed_golden": 0, "incomplete": 1}
    assert report["per_worker"]["p3"]["incomplete"] == 1 and report["per_worker"]["p2"]["incomplete"] == 0
    assert report["per_task"][t0["task_id"]]["incomplete"] == 1
    assert report["per_task"][t1["task_id"]] == {"submissions": 1, "failed_golden": 1, "incomplete": 1}
    stored = json.loads((tmp_path / "state" / "verdicts.json").read_text())["verdicts"]
    assert {v["worker"] for v in stored} == {"p2"}
    # A later export with p1's whole task counts it; the earlier skip stays on record.
    full = tmp_path / "full.json"
    full.write_text(json.dumps(studio_export(round_dir, [(i["item_id"], "p1") for i in t0["items"]])))
    assert cli_main(["eccv", "ingest", str(full), *args]) == 0
    report = json.loads(report_path.read_text())
    assert (report["submissions"], report["incomplete_submissions"]) == (2, 2)
    assert report["per_worker"]["p1"] == {"submissions": 1, "failed_golden": 1, "incomplete": 1}


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


def no_model(model_id: str):
    raise AssertionError(f"{model_id} was loaded although its embeddings are cached")


def test_model_bias_ranks_models_on_single_annotator_sets(ingested, round_dir, simulation, gallery,
                                                          annotators, brute, capsys, monkeypatch):
    from builders.eccv_positives import embeddings

    monkeypatch.setattr(embeddings, "load_encoder", no_model)  # the round's cache has them
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


def test_a_dataset_gallery_keeps_its_own_ids_apart_from_coco(gallery, annotators, tmp_path):
    """A dataset's ids are its own: numbers that are COCO ids elsewhere (a shipped CxC pair, the
    paper's Appendix C.1 caption 19273 and image 578492) are neither merged nor removed, unless
    --coco-ids says they are COCO ids."""
    import datasets

    from loading_scripts.eccv import read_positives

    cxc = read_positives("cxc", None)
    cxc_image = next(iter(cxc.i2t))
    cxc_caption = int(cxc.i2t[cxc_image][0])
    image_ids = [cxc_image, 578492, *range(2, 12)]
    captions = [[t for c, t in zip(gallery["caption_ids"], gallery["texts"]) if gallery["caption_image"][c] == i]
                for i in gallery["image_ids"][:12]]
    caption_ids = [[1000 + 10 * row + j for j in range(len(c))] for row, c in enumerate(captions)]
    caption_ids[2][0], caption_ids[3][0] = cxc_caption, 19273
    folder = tmp_path / "dataset"
    folder.mkdir()
    datasets.Dataset.from_dict({"image": list(map(str, gallery["paths"][:12])), "captions": captions,
                                "image_id": image_ids, "caption_ids": caption_ids}).cast_column(
        "image", datasets.Image()).to_parquet(str(folder / "test.parquet"))
    assert cli_main(["eccv", "candidates", "--dataset", str(folder), "--text-column", "captions",
                     "--image-id-column", "image_id", "--caption-id-column", "caption_ids",
                     "--model", annotators[0], "--image-queries", "12", "--caption-queries", "0",
                     "--exclusion-depth", "10", "--cache-dir", str(tmp_path / "cache"),
                     "--output", str(tmp_path / "c.json")]) == 0
    assert cli_main(["eccv", "tasks", str(tmp_path / "c.json"), "--output", str(tmp_path / "tasks")]) == 0
    no_verdicts = write_csv(tmp_path / "none.csv", [])
    original = {i: set(c) for i, c in zip(image_ids, caption_ids)}
    in_gallery = set().union(*original.values())
    as_coco = {i: (c | (in_gallery & set(cxc.i2t.get(i, np.empty(0)).tolist()))) - {19273}
               for i, c in original.items() if i != 578492}
    assert cxc_caption in as_coco[cxc_image]
    for flags, expected, merged in (([], original, None), (["--coco-ids"], as_coco, "shipped")):
        state = tmp_path / f"state{len(flags)}"
        assert cli_main(["eccv", "ingest", str(no_verdicts), "--tasks", str(tmp_path / "tasks"),
                         "--state", str(state), *flags]) == 0
        report = json.loads((state / "annotations" / "mitl_report.json").read_text())
        assert (report["gallery"], report["cxc_merged"], report["appendix_c1_removal"]) == \
            ("dataset", merged, bool(flags))
        positives = json.loads((state / "annotations" / "eccv_image_to_caption.json").read_text())
        assert {int(i): set(c) for i, c in positives.items()} == expected


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


def test_embedding_cache_is_reused_until_the_weights_or_images_change(gallery, annotators, tmp_path,
                                                                     monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from builders.eccv_positives import embeddings
    from builders.eccv_positives.gallery import Gallery

    model, root, cache = tmp_path / "clip", tmp_path / "coco", tmp_path / "cache"
    shutil.copytree(annotators[0], model)
    shutil.copytree(gallery["root"], root)
    g = Gallery.from_coco(root, ("test",))
    images, captions = embeddings.gallery_embeddings(str(model), g, cache)
    real_loader = embeddings.load_encoder
    monkeypatch.setattr(embeddings, "load_encoder", no_model)
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
    monkeypatch.setattr(embeddings, "load_encoder", real_loader)
    new_images, new_captions = embeddings.gallery_embeddings(str(model), g, cache)
    assert np.array_equal(new_images, images) and not np.allclose(new_captions, captions)
    # An image replaced in place invalidates the entry too.
    monkeypatch.setattr(embeddings, "load_encoder", no_model)
    Image.new("RGB", (64, 48), "red").save(root / g.image_files[0])
    rewritten(root / g.image_files[0])
    with pytest.raises(AssertionError, match="although its embeddings are cached"):
        embeddings.gallery_embeddings(str(model), g, cache)
