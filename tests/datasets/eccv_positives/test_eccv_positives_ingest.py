"""The verdicts' side of a machine-in-the-loop round (`counterfactory eccv ingest` and
`model-bias`), on the round of eccv_mitl_fixtures.py: a simulated annotation with a hidden ground
truth, good workers and spammers; bad verdict files, incomplete submissions, CxC ratings, --strict
and the model-bias report.
"""

from __future__ import annotations

import csv
import functools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from datasets import load_dataset
from helpers.eccv_mitl_fixtures import ANSWERS, NO, YES, no_model, ranked, round_args, write_csv

from builders.app.cli import main as cli_main
from builders.engine.provenance import model_name

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


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


@pytest.fixture(scope="module")
def simulation(round_dir, gallery):
    """5 good workers answer every task, 2 spammers every other one, and every fourth task gets a
    spam majority (6 workers saying "100% YES" to everything). Even tasks' good answers go to a
    Label Studio export, odd ones to a CSV, the spammers to their own CSV."""
    tasks = json.loads((round_dir / "tasks" / "tasks.json").read_text())["tasks"]
    studio = {
        t["data"]["item_id"]: t for t in json.loads((round_dir / "tasks" / "label_studio_tasks.json").read_text())
    }
    rng = random.Random(11)
    export, good_rows, spam_rows, submissions = [], [], [], []
    for n, task in enumerate(tasks):
        workers = [f"good{w}" for w in range(5)] + ([f"spam{n // 2 % 2}"] if n % 2 == 0 else [])
        workers += [f"spam-yes{w}" for w in range(6)] if n % 4 == 1 else []
        for worker in workers:
            answers = {
                i["item_id"]: (
                    spam_answer(i, rng, worker) if worker.startswith("spam") else good_answer(i, gallery, rng)
                )
                for i in task["items"]
            }
            submissions.append(
                {"task": task, "worker": worker, "answers": answers, "failed": failed_golden(answers, task)}
            )
            for item_id, answer in answers.items():
                row = (task["task_id"], item_id, worker, answer)
                if worker.startswith("spam"):
                    spam_rows.append(row)
                elif n % 2:
                    good_rows.append(row)
                else:
                    entry = dict(studio[item_id]) if item_id not in {e["data"]["item_id"] for e in export} else None
                    target = entry or next(e for e in export if e["data"]["item_id"] == item_id)
                    target.setdefault("annotations", []).append(
                        {
                            "completed_by": {"id": worker},
                            "was_cancelled": False,
                            "result": [
                                {
                                    "from_name": "answer",
                                    "to_name": "text",
                                    "type": "choices",
                                    "value": {"choices": [answer]},
                                }
                            ],
                        }
                    )
                    if entry:
                        export.append(entry)
    files = round_dir / "verdicts"
    files.mkdir()
    (files / "export.json").write_text(json.dumps(export))
    return {
        "tasks": tasks,
        "submissions": submissions,
        "files": [
            files / "export.json",
            write_csv(files / "good.csv", good_rows),
            write_csv(files / "spam.csv", spam_rows),
        ],
    }


@pytest.fixture(scope="module")
def ingested(round_dir, simulation, local_hub):
    """Ingest, build and publish the new version to the local Hub in one command."""
    out = round_dir / "v2"
    assert (
        cli_main(
            [
                "eccv",
                "ingest",
                *map(str, simulation["files"]),
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(round_dir / "state"),
                "--output",
                str(out),
                "--repo-id",
                "tester/eccv-mitl",
                "--version",
                "v2.0.0",
            ]
        )
        == 0
    )
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
    spam = {
        f"{s['task']['task_id']}/{s['worker']}" for s in simulation["submissions"] if s["worker"].startswith("spam")
    }
    assert spam and spam <= failed
    assert failed == {f"{s['task']['task_id']}/{s['worker']}" for s in simulation["submissions"] if s["failed"]}

    positives = {
        ("i2t", r["image_id"]): set(r["positive_caption_ids"])
        for r in load_dataset(str(ingested), "i2t", split="test")
        if r["eccv_query"]
    }
    positives |= {
        ("t2i", r["caption_id"]): set(r["positive_image_ids"])
        for r in load_dataset(str(ingested), "t2i", split="test")
        if r["eccv_query"]
    }
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
    # A COCO gallery: Appendix C.1 applies and CxC is merged.
    assert "verified pairs; removed invalid captions: " in card
    assert "; merged with CxC (the pairs shipped with `eccv_caption`) and the original COCO pairs." in card


def test_spam_majorities_count_only_with_keep_failed_golden(ingested, round_dir, simulation, tmp_path):
    assert any(s["worker"].startswith("spam-yes") for s in simulation["submissions"])
    assert (
        cli_main(
            [
                "eccv",
                "ingest",
                *map(str, simulation["files"]),
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(tmp_path / "state"),
                "--keep-failed-golden",
            ]
        )
        == 0
    )
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
    return {
        p.relative_to(round_dir).as_posix(): p.read_bytes()
        for p in sorted((round_dir / "state").rglob("*"))
        if p.is_file()
    }


def a_submission(task, worker: str, answer: str = "100% YES") -> list[tuple[str, str, str, str]]:
    return [(task["task_id"], i["item_id"], worker, answer) for i in task["items"]]


def test_bad_verdicts_are_clear_errors_and_lose_nothing(ingested, round_dir, simulation, tmp_path, capsys):
    tasks = simulation["tasks"]
    before = state_snapshot(round_dir)
    good = write_csv(tmp_path / "new_worker.csv", a_submission(tasks[1], "fresh"))
    unknown_task = write_csv(
        tmp_path / "unknown_task.csv",
        a_submission(tasks[0], "w9")[:3] + [("i2t-99999", "i2t-99999-00", "w9", "100% NO")],
    )
    unknown_item = write_csv(
        tmp_path / "unknown_item.csv", [(tasks[0]["task_id"], f"{tasks[0]['task_id']}-77", "w9", "100% NO")]
    )
    twice = write_csv(tmp_path / "twice.csv", a_submission(tasks[2], "good0", "100% NO"))
    malformed = tmp_path / "export.json"
    malformed.write_text(json.dumps([{"data": {"task_id": "x"}}])[:-5])
    expected = {
        unknown_task: ("row 5", "unknown task id"),
        unknown_item: ("row 2", "unknown item id"),
        twice: ("row 2", "already answered by worker good0"),
        malformed: ("malformed JSON at line 1", ""),
    }
    for bad, (where, what) in expected.items():
        # A valid file in the same call is not stored either: a call is all or nothing.
        code = cli_main(
            [
                "eccv",
                "ingest",
                str(good),
                str(bad),
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(round_dir / "state"),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and str(bad) in err and where in err and what in err, err
        assert len(err.strip().splitlines()) == 1
        assert state_snapshot(round_dir) == before


def studio_export(round_dir: Path, answers: list[tuple[str, str]]) -> list[dict]:
    """A Label Studio export of "100% YES" answers, given as (item id, worker) pairs."""
    studio = {
        t["data"]["item_id"]: t for t in json.loads((round_dir / "tasks" / "label_studio_tasks.json").read_text())
    }
    export: dict[str, dict] = {}
    for item_id, worker in answers:
        export.setdefault(item_id, dict(studio[item_id], annotations=[]))["annotations"].append(
            {
                "completed_by": {"id": worker},
                "was_cancelled": False,
                "result": [
                    {"from_name": "answer", "to_name": "text", "type": "choices", "value": {"choices": ["100% YES"]}}
                ],
            }
        )
    return list(export.values())


def test_incomplete_submissions_are_counted_skips(round_dir, simulation, tmp_path):
    """Label Studio shows each pair as its own task: an export holds half-done 20-item tasks."""
    t0, t1 = simulation["tasks"][:2]
    partial = tmp_path / "partial.json"
    partial.write_text(
        json.dumps(
            studio_export(
                round_dir,
                [(i["item_id"], "p1") for i in t0["items"][:7]]
                + [(i["item_id"], "p2") for i in t1["items"]]
                + [(i["item_id"], "p3") for i in t1["items"][1:]],
            )
        )
    )
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


def test_model_bias_ranks_models_on_single_annotator_sets(
    ingested, round_dir, simulation, gallery, annotators, brute, capsys, monkeypatch
):
    from builders.models import clip

    monkeypatch.setattr(clip, "load_scorer", no_model)  # the round's cache has them
    out = round_dir / "bias"
    assert (
        cli_main(
            [
                "eccv",
                "model-bias",
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(round_dir / "state"),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert "mAP@R" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "model_bias.csv")))
    # Models and sets are named by provenance (local folders: local:NAME@sha256:...).
    spec_of = {model_name(m): m for m in annotators}
    assert all(name.startswith("local:") for name in spec_of)
    assert {(r["model"], r["annotation_set"]) for r in rows} == {(m, s) for m in spec_of for s in [*spec_of, "all"]}
    assert (out / "model_bias.png").stat().st_size > 0
    # Reference: the verified pairs are the ground truth (previous test); a single annotator's
    # set keeps the positives it proposed.
    proposed = {
        (c["modality"], c["query_id"], c["item_id"]): c["proposed_by"]
        for c in json.loads((round_dir / "candidates.json").read_text())["candidates"]
    }
    verified = {
        (i["modality"], i["query_id"], i["caption_id"] if i["modality"] == "i2t" else i["image_id"]): i
        for s in simulation["submissions"]
        if not s["failed"]
        for i in s["task"]["items"]
        if i["kind"] == "candidate"
    }
    for row in rows:
        m, set_name, model = row["modality"], row["annotation_set"], row["model"]
        positives: dict[int, set[int]] = {}
        for pair, item in verified.items():
            if pair[0] == m and truth(item, gallery) and (set_name == "all" or set_name in proposed[pair]):
                positives.setdefault(pair[1], set()).add(pair[2])
        scores = brute[spec_of[model]][0 if m == "i2t" else 1]
        rows_ids = gallery["image_ids"] if m == "i2t" else gallery["caption_ids"]
        items = gallery["caption_ids"] if m == "i2t" else gallery["image_ids"]
        expected = np.mean(
            [
                map_at_r(ranked(scores, rows_ids.index(q), items, len(items)), pos)
                for q, pos in sorted(positives.items())
            ]
        )
        assert int(row["queries"]) == len(positives)
        assert float(row["map_at_r"]) == pytest.approx(expected, abs=1e-9)


def _reranked(scores, first, k: int) -> list[int]:
    """Gallery positions ranked by `scores` among the top k by `first` (ties: lower position)."""
    top = np.lexsort((np.arange(len(first)), -first))[:k]
    return [int(j) for j in top[np.lexsort((top, -scores[top]))]]


def _flava_itc_scores(folder, images: list, texts: list[str]) -> np.ndarray:
    """[images x texts] contrastive logits of FLAVA's contrastive model (a FlavaModel, read by
    FlavaForPreTraining), from one call of transformers' own forward: its global contrastive head
    scores every image of the batch against every text, so the images are cycled to the texts'
    count and the first len(images) rows kept."""
    import torch
    from transformers import AutoProcessor, FlavaForPreTraining

    assert len(texts) >= len(images)
    net, proc = FlavaForPreTraining.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    cycled = [images[n % len(images)] for n in range(len(texts))]
    with torch.no_grad():
        x = proc(images=cycled, text=texts, return_tensors="pt", padding=True, truncation=True)
        logits = net(**x, input_ids_masked=x["input_ids"], return_loss=False).contrastive_logits_per_image
    return logits[: len(images)].numpy()


@pytest.mark.parametrize(
    "family, beside",
    [
        pytest.param("blip", "clip", id="blip"),
        pytest.param("vilt", "clip", id="vilt"),
        pytest.param("vilt", "flava-itc", id="vilt-after-flava-itc"),
    ],
)
def test_model_bias_scores_a_reranker_from_its_top_k(
    family, beside, ingested, round_dir, gallery, annotators, brute, spread, tmp_path, capsys
):
    """A BLIP (its ITC top --rerank-k by ITM + ITC) or a ViLT re-ranking the top --rerank-k of a
    CLIP or of FLAVA's contrastive model (--first-stage; its ITM logit) is scored as `candidates`
    ranks it, beside that CLIP or FLAVA (by their embeddings): each model's mAP@R on every set
    equals that of the ranking computed here with transformers' own calls over the whole gallery
    (the CLIP's: the module's brute-force matrix); a --rerank-k below some query's number of
    positives is refused in one line."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, BlipForImageTextRetrieval, ViltForImageAndTextRetrieval

    model, other, k = str(spread[family]), annotators[0] if beside == "clip" else str(spread[beside]), 30
    argv = ["eccv", "model-bias", "--tasks", str(round_dir / "tasks"), "--state", str(round_dir / "state")]
    argv += ["--model", model, "--model", other, "--cache-dir", str(tmp_path / "cache")]
    argv += ["--first-stage", other] if family == "vilt" else []
    assert cli_main([*argv, "--rerank-k", "2", "--output", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "queries have more verified positives than --rerank-k 2" in err, err
    assert cli_main([*argv, "--rerank-k", str(k), "--output", str(tmp_path / "bias")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "bias" / "model_bias.csv")))
    how = {r["model"]: (r["retrieval"], r["k"], r["first_stage"]) for r in rows}
    assert how == {
        model_name(other): ("contrastive", "0", ""),
        model_name(model): (
            ("itc_top_k_reranked_by_itm_plus_itc", str(k), "")
            if family == "blip"
            else ("first_stage_top_k_reranked_by_itm", str(k), model_name(other))
        ),
    }
    assert f"| {model_name(model)} (ranked by {how[model_name(model)][0]}, k = {k}" in capsys.readouterr().out
    # The positive sets, from the ingest report and the proposers in candidates.json.
    report = json.loads((round_dir / "state" / "annotations" / "mitl_report.json").read_text())
    proposed = {
        (c["modality"], c["query_id"], c["item_id"]): c["proposed_by"]
        for c in json.loads((round_dir / "candidates.json").read_text())["candidates"]
    }
    cls = BlipForImageTextRetrieval if family == "blip" else ViltForImageAndTextRetrieval
    net, proc = cls.from_pretrained(model).eval(), AutoProcessor.from_pretrained(model)
    images = [Image.open(p).convert("RGB") for p in gallery["paths"]]
    texts = list(dict.fromkeys(gallery["texts"]))  # a repeated caption is one pair, one score
    text_of = [texts.index(t) for t in gallery["texts"]]
    if beside == "clip":
        beside_i2t, beside_t2i = brute[other]
    else:  # [gallery images x gallery captions], a repeated caption's copies tied
        beside_i2t = _flava_itc_scores(other, images, texts)[:, text_of]
        beside_t2i = beside_i2t.T

    @functools.cache  # a query's ranking, once for its 3 sets
    def ranking(modality: str, q: int) -> list[int]:
        if modality == "i2t":
            pairs = [images[gallery["image_ids"].index(q)]] * len(texts), texts
        else:
            pairs = images, [gallery["texts"][gallery["caption_ids"].index(q)]] * len(images)
        with torch.no_grad():
            x = proc(images=pairs[0], text=pairs[1], return_tensors="pt", padding=True, truncation=True)
            if family == "blip":
                first = net(**x, use_itm_head=False).itm_score.diagonal().numpy()
                score = net(**x, use_itm_head=True).itm_score[:, 1].numpy() + first
            else:
                score = net(**x).logits[:, 0].numpy()
        if modality == "i2t":
            first = first[text_of] if family == "blip" else beside_i2t[gallery["image_ids"].index(q)]
            return [gallery["caption_ids"][j] for j in _reranked(score[text_of], first, k)]
        first = first if family == "blip" else beside_t2i[gallery["caption_ids"].index(q)]
        return [gallery["image_ids"][j] for j in _reranked(score, first, k)]

    @functools.cache
    def beside_ranking(modality: str, q: int) -> list[int]:  # its embeddings, the whole gallery
        if modality == "i2t":
            return ranked(
                beside_i2t, gallery["image_ids"].index(q), gallery["caption_ids"], len(gallery["caption_ids"])
            )
        return ranked(beside_t2i, gallery["caption_ids"].index(q), gallery["image_ids"], len(images))

    checked = 0
    for row in rows:
        m, set_name, mine = row["modality"], row["annotation_set"], row["model"] == model_name(model)
        positives: dict[int, set[int]] = {}
        for mod, q, item in report["human_positive_pairs"]:
            if mod == m and (set_name == "all" or set_name in proposed[(mod, q, item)]):
                positives.setdefault(q, set()).add(item)
        rank = ranking if mine else beside_ranking
        expected = [map_at_r(rank(m, q), p) for q, p in sorted(positives.items())]
        assert int(row["queries"]) == len(positives)
        assert float(row["map_at_r"]) == pytest.approx(np.mean(expected), abs=1e-9), row
        checked += 1
    assert checked == 12  # 2 models x 3 sets (2 annotators, all) x 2 modalities


def test_model_bias_ranks_a_rounds_reranker_with_the_rounds_first_stage_and_k(
    gallery, annotators, spread, tmp_path, capsys
):
    """Without --model, model-bias ranks the round's annotators with the round's own --first-stage
    and --rerank-k (recorded in candidates.json), not the defaults: a round with a ViLT re-ranking
    a CLIP's top 30, verified by one truthful worker."""
    vilt, clip = str(spread["vilt"]), annotators[0]
    argv = ["eccv", "candidates", "--coco-root", str(gallery["root"]), "--model", clip, "--model", vilt]
    argv += ["--first-stage", clip, "--rerank-k", "30", "--cache-dir", str(tmp_path / "cache")]
    assert cli_main([*argv, *round_args(4, 4, 2), "--output", str(tmp_path / "c.json")]) == 0
    assert cli_main(["eccv", "tasks", str(tmp_path / "c.json"), "--output", str(tmp_path / "tasks")]) == 0
    tasks = json.loads((tmp_path / "tasks" / "tasks.json").read_text())["tasks"]
    rows = [
        (t["task_id"], i["item_id"], "w", "100% YES" if truth(i, gallery) else "100% NO")
        for t in tasks
        for i in t["items"]
    ]
    round_ = ["--tasks", str(tmp_path / "tasks"), "--state", str(tmp_path / "state")]
    assert cli_main(["eccv", "ingest", str(write_csv(tmp_path / "v.csv", rows)), *round_]) == 0
    assert cli_main(["eccv", "model-bias", *round_, "--output", str(tmp_path / "bias")]) == 0
    found = {
        r["model"]: (r["retrieval"], r["k"], r["first_stage"])
        for r in csv.DictReader(open(tmp_path / "bias" / "model_bias.csv"))
    }
    assert found == {
        model_name(clip): ("contrastive", "0", ""),
        model_name(vilt): ("first_stage_top_k_reranked_by_itm", "30", model_name(clip)),
    }
    assert (
        f"{model_name(vilt)} (ranked by first_stage_top_k_reranked_by_itm, k = 30, first stage"
        in capsys.readouterr().out
    )


def test_cxc_ratings_are_merged_above_the_threshold(round_dir, simulation, gallery, tmp_path):
    """CxC's SITS rows for gallery pairs: those scoring >= 3 join the positives, the others not."""
    tasks = json.loads((round_dir / "tasks" / "tasks.json").read_text())
    image = tasks["queries"]["i2t"][0]
    caption = next(c for c, i in gallery["caption_image"].items() if i != image)
    low = next(c for c, i in gallery["caption_image"].items() if i != image and c != caption)
    sits = tmp_path / "sits_test.csv"
    sits.write_text(
        "caption,image,agg_score,sampling_method\n"
        f"COCO_val2014:sentid:{caption},COCO_val2014_{image:012d}.jpg,3.4,c2i_intrasim\n"
        f"COCO_val2014:sentid:{low},COCO_val2014_{image:012d}.jpg,2.9,c2i_intrasim\n"
    )
    out = tmp_path / "v3"
    assert (
        cli_main(
            [
                "eccv",
                "ingest",
                str(simulation["files"][0]),
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(tmp_path / "state"),
                "--cxc-sits",
                str(sits),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    rows = {r["image_id"]: r for r in load_dataset(str(out), "i2t", split="test")}
    assert rows[image]["cxc_caption_ids"] == [caption]
    assert caption in rows[image]["positive_caption_ids"]
    assert "cxc" in rows[image]["positive_sources"]
    assert "pairs scoring ≥ 3.0 in" in (out / "README.md").read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text("caption,image,agg_score,sampling_method\nCOCO_val2014:sentid:x,img.jpg,3,y\n")
    assert (
        cli_main(
            [
                "eccv",
                "ingest",
                str(simulation["files"][0]),
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(tmp_path / "state2"),
                "--cxc-sits",
                str(bad),
            ]
        )
        == 2
    )
    assert not (tmp_path / "state2" / "verdicts.json").exists()  # a failed call stores nothing


def test_strict_keeps_only_full_yes_majorities(round_dir, simulation, gallery, tmp_path):
    out = tmp_path / "strict"
    assert (
        cli_main(
            [
                "eccv",
                "ingest",
                str(simulation["files"][0]),
                "--tasks",
                str(round_dir / "tasks"),
                "--state",
                str(tmp_path / "state"),
                "--strict",
                "--output",
                str(out),
            ]
        )
        == 0
    )
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
    rows = {
        ("i2t", r["image_id"]): set(r["positive_caption_ids"])
        for r in load_dataset(str(out), "i2t", split="test")
        if r["eccv_query"]
    }
    rows |= {
        ("t2i", r["caption_id"]): set(r["positive_image_ids"])
        for r in load_dataset(str(out), "t2i", split="test")
        if r["eccv_query"]
    }
    for (m, q, other), v in votes.items():
        original = (gallery["caption_image"][other] == q) if m == "i2t" else (gallery["caption_image"][q] == other)
        expected = original or sum(v) > len(v) - sum(v)
        assert (other in rows.get((m, q), set())) == expected


def test_bias_ranks_and_rank_agreement_on_hand_made_scores():
    """Eq. E.5 and the rankings on numbers worked out by hand: models a, b, c scored on the sets
    built by annotator a, by annotator b, and by all annotators."""
    from builders.eccv_positives.mitl.model_bias import bias, rank_agreement, rankings

    scores = {
        ("a", "a"): 0.9,
        ("b", "a"): 0.5,
        ("c", "a"): 0.4,
        ("a", "b"): 0.3,
        ("b", "b"): 0.2,
        ("c", "b"): 0.4,
        ("a", "all"): 0.6,
        ("b", "all"): 0.7,
        ("c", "all"): 0.4,
    }
    rows = [{"model": m, "annotation_set": s, "modality": "i2t", "map_at_r": v} for (m, s), v in scores.items()]
    b = bias(rows)
    # Set a: |0.9-0.6|, |0.5-0.7|, |0.4-0.4| -> mean 0.5/3; self (model a) 0.3; others 0.1.
    assert b["a/i2t"] == pytest.approx({"bias": 0.5 / 3, "self_bias": 0.3, "non_self_bias": 0.1})
    # Set b: |0.3-0.6|, |0.2-0.7|, 0 -> mean 0.8/3; self (model b) 0.5; others 0.15.
    assert b["b/i2t"] == pytest.approx({"bias": 0.8 / 3, "self_bias": 0.5, "non_self_bias": 0.15})
    assert rankings(rows, "i2t") == {
        "a": {"a": 1, "b": 2, "c": 3},
        "b": {"a": 2, "b": 3, "c": 1},
        "all": {"a": 2, "b": 1, "c": 3},
    }
    # Against all's order (b, a, c): set a (a, b, c) disagrees on one pair of three (tau 1/3),
    # set b (c, a, b) on all three (tau -1).
    assert rank_agreement(rows, "i2t") == pytest.approx({"a": 1 / 3, "b": -1.0})
