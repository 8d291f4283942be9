"""Retrieval by a cross-encoder through `counterfactory benchmark` (#51), checked against brute
force written here from the models' own transformers calls: with k the gallery size, BLIP's
two-stage ranking (ITC top k, then ITM logit + ITC similarity, as BLIP's `train_retrieval.py`
adds them) and a first stage's top k re-ranked by ViLT's or BridgeTower's ITM score are the full
ranking of every pair; FLAVA ranks by its contrastive embeddings alone. k and the first stage are
in every ranked record, the report and the results dataset."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from builders.app.cli import main as cli_main
from builders.engine.provenance import model_name
from helpers.training_helpers import read_jsonl, report_builds
from builders.models.cross_ranking import BLIP_METHOD
from training.rerank import FIRST_STAGE_METHOD as FIRST_STAGE

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

COMMON = ["--blind-lm", "none", "--bootstrap", "50", "--no-plots", "--eval-batch-size", "7"]
#: family -> (transformers class, its ITM G of one pair as its reference reads it)
ITM = {
    "blip": ("BlipForImageTextRetrieval", lambda m, x: m(**x, use_itm_head=True).itm_score[0, 1]),
    "vilt": ("ViltForImageAndTextRetrieval", lambda m, x: m(**x).logits[0, 0]),
    "bridgetower": ("BridgeTowerForImageAndTextRetrieval", lambda m, x: m(**x).logits[0, 1]),
    "bridgetower-itc": ("BridgeTowerForContrastiveLearning", lambda m, x: _itc_logit(m, m(**x))),
}


def _itc_logit(model, out):
    """BridgeTowerForContrastiveLearning's cell of the `logits_text_to_image` its forward computes
    for its loss: the logit scale times the cosine of the pair's `text_embeds` and `image_embeds`."""
    return model.logit_scale.exp() * out.text_embeds[0] @ out.image_embeds[0]


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    return report_builds(tmp_path_factory.mktemp("builds"), coco_fixture_dir)


def _test_split(cc):
    """The coco build's test images (RGB) and their captions, flattened in row order, with the
    image row of each caption."""
    from datasets import load_dataset

    rows = load_dataset(str(cc), "default", split="test")
    images = [r["image"].convert("RGB") for r in rows]
    captions = [c for r in rows for c in r["captions"]]
    owner = np.repeat(np.arange(len(rows)), [len(r["captions"]) for r in rows])
    return images, captions, owner


def _brute_force(folder, family: str, cc) -> np.ndarray:
    """(images, captions): every pair scored alone by the model's own call (`ITM`: its ITM logit,
    or BridgeTower's contrastive logit), plus BLIP's ITC similarity (its `use_itm_head=False`
    output) for BLIP."""
    import transformers

    cls, itm = ITM[family]
    model = getattr(transformers, cls).from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    images, captions, _ = _test_split(cc)
    out = np.zeros((len(images), len(captions)))
    with torch.no_grad():
        for i, img in enumerate(images):
            for c, cap in enumerate(captions):
                x = processor(images=img, text=cap, return_tensors="pt")
                out[i, c] = float(itm(model, x))
                if family == "blip":
                    out[i, c] += float(model(**x, use_itm_head=False).itm_score[0, 0])
    return out


def _hits(row: np.ndarray, positives: np.ndarray, k: int, tol: float) -> tuple[bool, bool]:
    """(surely, possibly) a positive in the top k of `row`, whichever way scores within `tol` of
    each other (float noise: a tiny random-init model scores some pairs alike) tie."""
    best = [(int((row > row[p] + tol).sum()), int((row >= row[p] - tol).sum()) - 1) for p in positives]
    return min(b for _, b in best) < k, min(a for a, _ in best) < k


def _recall_bounds(scores: np.ndarray, owner: np.ndarray, tol: float, ks=(1, 5, 10)) -> dict[str, tuple]:
    """R@K both ways ranked by brute force from an (images, captions) score matrix: (lowest,
    highest) over the orders of its near-ties; equal where no near-tie is at the cut."""
    out = {}
    for k in ks:
        i2t = np.array([_hits(row, np.flatnonzero(owner == i), k, tol) for i, row in enumerate(scores)])
        t2i = np.array([_hits(scores[:, c], np.array([owner[c]]), k, tol) for c in range(scores.shape[1])])
        out[f"text_retrieval_recall@{k}"] = tuple(i2t.mean(0))
        out[f"image_retrieval_recall@{k}"] = tuple(t2i.mean(0))
    return out


def _in_bounds(metrics: dict, bounds: dict) -> None:
    for name, (low, high) in bounds.items():
        assert low - 1e-9 <= metrics[name] <= high + 1e-9, (name, metrics[name], low, high)
    # Not vacuous: some R@K is fixed by brute force whatever the ties.
    assert any(low == high and 0 < low < 1 for low, high in bounds.values()), bounds


def _dense(idx: np.ndarray, score: np.ndarray, width: int) -> np.ndarray:
    out = np.full((len(idx), width), np.nan)
    np.put_along_axis(out, idx, score, 1)
    return out


@pytest.mark.parametrize("family", ["blip", "vilt", "bridgetower"])
def test_two_stage_at_k_gallery_is_the_brute_force_ranking(
    family, builds, tiny_families_dir, tiny_models_dir, tmp_path
):
    from builders.models.profiles import tiny_profile

    cc, _, _ = builds
    folder, clip = tiny_families_dir / family, str(tiny_profile(tiny_models_dir).clip)
    first = [] if family == "blip" else ["--first-stage", clip]
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["benchmark", "--model", str(folder), "--coco", str(cc), "--output", str(out), "--cache-dir", str(cache)]
    assert cli_main([*argv, *first, "--rerank-k", "1000", *COMMON]) == 0
    brute = _brute_force(folder, family, cc)
    (entry,) = cache.glob("coco-*.npz")
    with np.load(entry) as z:
        i2t = _dense(z["rr_i2t_idx"], z["rr_i2t_score"], brute.shape[1])
        t2i = _dense(z["rr_t2i_idx"], z["rr_t2i_score"], brute.shape[0])
    # k = gallery: every pair was re-ranked, by the score brute force gives it.
    np.testing.assert_allclose(i2t, brute, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t2i, brute.T, rtol=1e-5, atol=1e-5)
    assert np.ptp(brute) > 0
    # The report's ranking is brute force's: each query's items in the two-stage order have
    # non-increasing brute-force scores (up to float noise), and its R@K is brute force's.
    for mine, full in ((i2t, brute), (t2i, brute.T)):
        ordered = np.take_along_axis(full, np.argsort(-mine, axis=1, kind="stable"), 1)
        assert (np.diff(ordered, axis=1) <= 1e-5).all()
    (ranked,) = [r for r in read_jsonl(out / "results.jsonl") if r["task"] == "zeroshot_retrieval"]
    _in_bounds(ranked["metrics"], _recall_bounds(brute, _test_split(cc)[2], 1e-5))
    want = {
        "method": "itc_top_k_reranked_by_itm_plus_itc" if family == "blip" else "first_stage_top_k_reranked_by_itm",
        "k": 1000,
        "first_stage": None if family == "blip" else model_name(clip),
    }
    assert ranked["retrieval"] == want


@pytest.mark.parametrize("family", ["flava", "flava-itc"])
def test_flava_ranks_by_its_contrastive_embeddings(family, builds, tiny_families_dir, tmp_path):
    """FLAVA's paper ranks zero-shot retrieval by its contrastive embeddings, no ITM: R@K equals
    the ranking of the model's own `contrastive_logits_per_image`, and the records say k = 0.
    `flava-itc` is a FlavaModel, loaded here as FlavaForPreTraining (its weights are its `flava`)."""
    import transformers

    cc, _, _ = builds
    folder, out = tiny_families_dir / family, tmp_path / "out"
    assert cli_main(["benchmark", "--model", str(folder), "--coco", str(cc), "--output", str(out), *COMMON]) == 0
    model = transformers.FlavaForPreTraining.from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    images, captions, owner = _test_split(cc)
    logits = np.zeros((len(images), len(captions)))
    with torch.no_grad():  # one pair a call: its multimodal encoder pairs image i with caption i
        for i, img in enumerate(images):
            for c, cap in enumerate(captions):
                x = processor(images=img, text=cap, return_tensors="pt")
                out_ = model(**x, input_ids_masked=x["input_ids"], return_loss=False)
                logits[i, c] = float(out_.contrastive_logits_per_image[0, 0])
    (ranked,) = [r for r in read_jsonl(out / "results.jsonl") if r["task"] == "zeroshot_retrieval"]
    # The logits are the logit scale times the cosine: the same ranking.
    _in_bounds(ranked["metrics"], _recall_bounds(logits, owner, 1e-4))
    assert ranked["retrieval"] == {"method": "contrastive", "k": 0, "first_stage": None}


def _logit_scale(folder) -> float:
    import transformers

    return float(transformers.BridgeTowerForContrastiveLearning.from_pretrained(folder).logit_scale.detach())


def test_bridgetower_contrastive_head_ranks_by_its_own_logits(builds, tiny_families_dir, tmp_path):
    """BridgeTowerForContrastiveLearning as --model: R@K and the cached similarities are its own
    logits_per_image (brute force, one pair a call), k = 0, and its real pairs' G is its logit."""
    cc, _, _ = builds
    folder, out, cache = tiny_families_dir / "bridgetower-itc", tmp_path / "out", tmp_path / "cache"
    argv = ["benchmark", "--model", str(folder), "--coco", str(cc), "--output", str(out), "--cache-dir", str(cache)]
    assert cli_main([*argv, *COMMON]) == 0
    logits = _brute_force(folder, "bridgetower-itc", cc)
    assert np.ptp(logits) > 0
    (entry,) = cache.glob("coco-*.npz")
    with np.load(entry) as z:
        # Its embeddings' cosines, which rank as its logits do: times its logit scale, its logits.
        cosines = z["first_image"].astype(np.float64) @ z["first_text"].T
        np.testing.assert_allclose(np.exp(_logit_scale(folder)) * cosines, logits, rtol=1e-5, atol=1e-5)
        assert z["rr_i2t_idx"].shape[1] == 0 and z["rr_t2i_idx"].shape[1] == 0
    records = read_jsonl(out / "results.jsonl")
    (ranked,) = [r for r in records if r["task"] == "zeroshot_retrieval"]
    _in_bounds(ranked["metrics"], _recall_bounds(logits, _test_split(cc)[2], 1e-4))
    assert ranked["retrieval"] == {"method": "contrastive", "k": 0, "first_stage": None}
    (itm,) = [r for r in records if r["task"] == "itm"]
    assert itm["g_kind"] == "bridgetower_itc_logit"


def test_bridgetower_itm_re_ranks_its_contrastive_heads_top_k(builds, tiny_families_dir, tmp_path, capsys):
    """BridgeTower's own retrieval evaluation (compute_irtr_itm_itc_recall): the ITC top k of each
    query, ranked by the ITM head's logit alone. Each query's 3 candidates are the contrastive
    head's brute-force top 3 and their scores the ITM head's own, pair by pair."""
    cc, _, _ = builds
    itm, itc = tiny_families_dir / "bridgetower", tiny_families_dir / "bridgetower-itc"
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["benchmark", "--model", str(itm), "--first-stage", str(itc), "--coco", str(cc), "--rerank-k", "3"]
    assert cli_main([*argv, "--output", str(out), "--cache-dir", str(cache), *COMMON]) == 0
    first, second = _brute_force(itc, "bridgetower-itc", cc), _brute_force(itm, "bridgetower", cc)
    (entry,) = cache.glob("coco-*.npz")
    with np.load(entry) as z:
        for direction, ranked, scored in (("i2t", first, second), ("t2i", first.T, second.T)):
            idx, score = z[f"rr_{direction}_idx"], z[f"rr_{direction}_score"]
            assert idx.shape == (len(ranked), 3)
            picked, others = np.take_along_axis(ranked, idx, 1), ranked.copy()
            np.put_along_axis(others, idx, -np.inf, 1)
            assert (picked.min(1) >= others.max(1) - 1e-5).all(), direction  # the ITC top 3
            # ... which are not the ITM head's own top 3: the first stage decides.
            itm_top = np.argsort(-scored, axis=1, kind="stable")[:, :3]
            assert any(set(a) != set(b) for a, b in zip(idx, itm_top, strict=True)), direction
            np.testing.assert_allclose(score, np.take_along_axis(scored, idx, 1), rtol=1e-5, atol=1e-5)
    (ranked,) = [r for r in read_jsonl(out / "results.jsonl") if r["task"] == "zeroshot_retrieval"]
    assert ranked["retrieval"] == {
        "method": "first_stage_top_k_reranked_by_itm",
        "k": 3,
        "first_stage": model_name(str(itc)),
    }
    # A first stage with no embeddings of its own (ViLT) is one line, before any data is read.
    capsys.readouterr()
    vilt = ["--first-stage", str(tiny_families_dir / "vilt"), "--coco", str(tmp_path / "none")]
    assert cli_main(["benchmark", "--model", str(itm), *vilt, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ViLT" in err and "BridgeTowerForContrastiveLearning" in err, err


@pytest.mark.parametrize("first", ["flava", "blip"])
def test_a_first_stage_may_be_a_cross_encoders_own_contrastive_embeddings(first, builds, tiny_families_dir, tmp_path):
    """ViLT re-ranking the top 3 of FLAVA's or BLIP's contrastive embeddings: its first-stage
    arrays are those the model ranks by itself (its own benchmark's cache), and each query's
    candidates are their top 3."""
    cc, _, _ = builds
    folder = str(tiny_families_dir / first)
    argv = ["benchmark", "--coco", str(cc), *COMMON]
    own = ["--model", folder, "--output", str(tmp_path / "own"), "--cache-dir", str(tmp_path / "own-cache")]
    assert cli_main([*argv, *own]) == 0
    vilt = ["--model", str(tiny_families_dir / "vilt"), "--first-stage", folder, "--rerank-k", "3"]
    assert cli_main([*argv, *vilt, "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "cache")]) == 0
    (mine,), (theirs,) = (tmp_path / "cache").glob("coco-*.npz"), (tmp_path / "own-cache").glob("coco-*.npz")
    with np.load(mine) as z, np.load(theirs) as ref:
        for name in ("first_image", "first_text"):
            np.testing.assert_allclose(z[name], ref[name], rtol=1e-5, atol=1e-6)
        sim = ref["first_image"].astype(np.float64) @ ref["first_text"].T
        for direction, matrix in (("i2t", sim), ("t2i", sim.T)):
            picked, others = np.take_along_axis(matrix, z[f"rr_{direction}_idx"], 1), matrix.copy()
            np.put_along_axis(others, z[f"rr_{direction}_idx"], -np.inf, 1)
            assert (picked.min(1) >= others.max(1) - 1e-6).all(), direction
    (ranked,) = [r for r in read_jsonl(tmp_path / "o" / "results.jsonl") if r["task"] == "zeroshot_retrieval"]
    assert ranked["retrieval"] == {"method": FIRST_STAGE, "k": 3, "first_stage": model_name(folder)}


def test_vilt_without_a_first_stage_refuses_retrieval_in_one_line_and_scores_its_deltas(
    builds, tiny_families_dir, tmp_path, caplog, capsys
):
    """No first stage: one logged line naming --first-stage, no ranked record, and the real-pair
    deltas IR_r / TR_r of --coco from ViLT's own G, checked against its forward call (the
    metric module's seeded partners)."""
    import transformers

    from counterfactory_metrics.itm_score_deltas.deltas import PAIR_SEED, random_derangement

    cc, dec, cf = builds
    folder, out = tiny_families_dir / "vilt", tmp_path / "out"
    argv = ["benchmark", "--model", str(folder), "--coco", str(cc), "--decorrelation", str(dec)]
    with caplog.at_level(logging.WARNING):
        assert cli_main([*argv, "--counterfactuals", str(cf), "--output", str(out), *COMMON]) == 0
    said = [r.getMessage() for r in caplog.records if str(folder) in r.getMessage()]
    assert len(said) == 1 and "--first-stage" in said[0] and "ITM deltas" in said[0], said
    records = read_jsonl(out / "results.jsonl")
    assert {(r["dataset"], r["task"]) for r in records} == {("coco", "itm"), ("counterfactuals", "itm")}
    model = transformers.ViltForImageAndTextRetrieval.from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    images, captions, owner = _test_split(cc)
    cap = [captions[int(np.flatnonzero(owner == i)[0])] for i in range(len(images))]
    r = random_derangement(len(images), PAIR_SEED)

    def g(i: int, c: int) -> float:
        with torch.no_grad():
            return float(model(**processor(images=images[i], text=cap[c], return_tensors="pt")).logits[0, 0])

    ir = [g(r[i], r[i]) - g(i, r[i]) for i in range(len(images))]  # G(C_r, I_r) - G(C_r, I_o)
    tr = [g(r[i], r[i]) - g(r[i], i) for i in range(len(images))]  # G(C_r, I_r) - G(C_o, I_r)
    (itm,) = [r for r in records if r["dataset"] == "coco"]
    assert itm["metrics"]["IR_r_mean"] == pytest.approx(np.mean(ir), abs=1e-6)
    assert itm["metrics"]["TR_r_mean"] == pytest.approx(np.mean(tr), abs=1e-6)
    assert np.ptp(ir) > 0 and itm["ci_low"]["IR_r_mean"] is not None and itm["pair_seed"] == PAIR_SEED
    # Nothing it could score: one line naming the flag, before any model is loaded.
    capsys.readouterr()
    assert (
        cli_main(["benchmark", "--model", str(folder), "--decorrelation", str(dec), "--output", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ViLT" in err and "--first-stage" in err, err


def test_a_first_stage_is_named_with_k_in_records_report_and_cache(
    builds, tiny_families_dir, tiny_models_dir, tmp_path, monkeypatch
):
    """ViLT re-ranking a CLIP's top 3 on --coco and --decorrelation: R@K, ODmAP and ODmAP per
    class in its records and the report, each with the method, k and the first stage; a second
    report with the same k scores no pair again, another k is another cache entry."""
    import training.rerank as rerank
    from builders.models.profiles import tiny_profile

    cc, dec, _ = builds
    folder, clip = tiny_families_dir / "vilt", str(tiny_profile(tiny_models_dir).clip)
    argv = ["benchmark", "--model", str(folder), "--first-stage", clip, "--coco", str(cc), "--decorrelation", str(dec)]
    argv += ["--cache-dir", str(tmp_path / "cache"), *COMMON]
    assert cli_main([*argv, "--rerank-k", "3", "--output", str(tmp_path / "out")]) == 0
    records = read_jsonl(tmp_path / "out" / "results.jsonl")
    want = {"method": "first_stage_top_k_reranked_by_itm", "k": 3, "first_stage": model_name(clip)}
    ranked = {r["task"]: r for r in records if r["task"] != "itm"}
    assert set(ranked) == {"zeroshot_retrieval", "odmap", "odmap_per_class"}
    assert all(r["retrieval"] == want for r in ranked.values())
    assert "retrieval" not in next(r for r in records if r["task"] == "itm")
    assert {"ODmAP@1", "ODmAP@10"} <= ranked["odmap"]["metrics"].keys()
    assert ranked["zeroshot_retrieval"]["ci_low"]["text_retrieval_recall@1"] is not None
    report = (tmp_path / "out" / "report.md").read_text()
    note = f"(ranked by first\\_stage\\_top\\_k\\_reranked\\_by\\_itm, k = 3, first stage {model_name(clip)})"
    for row in ("| coco | zeroshot\\_retrieval ", "| decorrelation | odmap "):
        lines = [line for line in report.splitlines() if line.startswith(row)]
        assert lines and all(note in line for line in lines), (row, lines[:2])
    assert any("text\\_retrieval\\_recall@5" in line for line in report.splitlines() if note in line)
    scored = []
    score = rerank.PairPool.score
    monkeypatch.setattr(rerank.PairPool, "score", lambda *a: scored.append(1) or score(*a))
    assert cli_main([*argv, "--rerank-k", "3", "--output", str(tmp_path / "again")]) == 0
    assert scored == []
    assert [r["metrics"] for r in read_jsonl(tmp_path / "again" / "results.jsonl")] == [r["metrics"] for r in records]
    assert cli_main([*argv, "--rerank-k", "4", "--output", str(tmp_path / "k4")]) == 0
    assert scored and len(list((tmp_path / "cache").glob("coco-*.npz"))) == 2


def test_the_results_dataset_keeps_k_and_the_first_stage(
    builds, tiny_families_dir, tiny_models_dir, repo_id, tmp_path
):
    from datasets import load_dataset

    from builders.models.profiles import tiny_profile

    cc, _, _ = builds
    folder, clip = tiny_families_dir / "vilt", str(tiny_profile(tiny_models_dir).clip)
    argv = ["benchmark", "--model", str(folder), "--first-stage", clip, "--coco", str(cc), "--push-to-hub", repo_id]
    for k in ("3", "5"):
        assert cli_main([*argv, "--rerank-k", k, "--output", str(tmp_path / k), *COMMON]) == 0
    rows = load_dataset(repo_id, split="train", download_mode="force_redownload")
    ranked = sorted(json.loads(r["retrieval"])["k"] for r in rows if r["task"] == "zeroshot_retrieval")
    assert ranked == [3, 5]
    assert all(
        json.loads(r["retrieval"])["first_stage"] == model_name(clip)
        for r in rows
        if r["task"] == "zeroshot_retrieval"
    )


def _eval_only(folder, builds, out, *extra: str) -> int:
    """`counterfactory train --eval-only --model folder` on the coco build and the counterfactuals."""
    cc, _, cf = builds
    argv = ["train", "--real", str(cc), "--counterfactuals", str(cf), "--model", str(folder), "--eval-only"]
    argv += ["--num-workers", "0", "--eval-batch-size", "7", "--report-to", "none", "--bootstrap", "20"]
    return cli_main([*argv, "--output", str(out), *extra])


def test_train_eval_only_ranks_blip_as_the_benchmark_does(builds, tiny_families_dir, tmp_path):
    """The trainer's evaluation of a BLIP model has R@K by the benchmark's two-stage ranking (k =
    256 >= the gallery: brute force's full ranking), equal to the benchmark's numbers, with the
    method and k in run.json, beside the ITM deltas of the counterfactual and the real pairs."""
    cc, _, _ = builds
    folder, bench = tiny_families_dir / "blip", tmp_path / "bench"
    assert cli_main(["benchmark", "--model", str(folder), "--coco", str(cc), "--output", str(bench), *COMMON]) == 0
    (ranked,) = [r for r in read_jsonl(bench / "results.jsonl") if r["task"] == "zeroshot_retrieval"]
    assert _eval_only(folder, builds, tmp_path / "run") == 0
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["retrieval"] == ranked["retrieval"] == {"method": BLIP_METHOD, "k": 256, "first_stage": None}
    final = record["final_metrics"]
    recalls = {k.split("/", 1)[1]: v for k, v in final.items() if k.startswith("zeroshot_retrieval/")}
    assert len(recalls) >= 6 and set(ranked["metrics"]) <= set(recalls)
    for name, value in ranked["metrics"].items():
        assert recalls[name] == pytest.approx(value, abs=1e-6), name
    _in_bounds(recalls, _recall_bounds(_brute_force(folder, "blip", cc), _test_split(cc)[2], 1e-5))
    assert {"itm/IR_c_mean", "itm/TR_c_mean", "itm/IR_r_mean", "itm/TR_r_mean"} <= final.keys()
    assert "zeroshot_retrieval/text_retrieval_recall@1" in record["final_intervals"]


@pytest.mark.parametrize("family", ["bridgetower", "vilt", "flava"])
def test_train_eval_only_ranks_each_family_as_the_benchmark_does(
    family, builds, tiny_families_dir, tiny_models_dir, tmp_path
):
    """`counterfactory train --eval-only` of BridgeTower's and ViLT's ITM heads re-ranking a tiny
    CLIP's top 3 (`--first-stage`, `--rerank-k`: the benchmark's flags), and of FLAVA by its
    contrastive embeddings: R@K and ODmAP equal `counterfactory benchmark`'s for the same model,
    first stage, k and data, and run.json says how it ranked as the benchmark's records do."""
    from builders.models.profiles import tiny_profile

    cc, dec, _ = builds
    folder, clip = tiny_families_dir / family, str(tiny_profile(tiny_models_dir).clip)
    first = [] if family == "flava" else ["--first-stage", clip, "--rerank-k", "3"]
    bench = tmp_path / "bench"
    argv = ["benchmark", "--model", str(folder), "--coco", str(cc), "--decorrelation", str(dec), *first]
    assert cli_main([*argv, "--output", str(bench), *COMMON]) == 0
    ranked = [r for r in read_jsonl(bench / "results.jsonl") if r["task"] in ("zeroshot_retrieval", "odmap")]
    assert len(ranked) == 2
    assert _eval_only(folder, builds, tmp_path / "run", "--decorrelation", str(dec), *first) == 0
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    final = record["final_metrics"]
    for r in ranked:
        assert record["retrieval"] == r["retrieval"], (record["retrieval"], r["retrieval"])
        assert len(r["metrics"]) >= 3
        for name, value in r["metrics"].items():
            assert final[f"{r['task']}/{name}"] == pytest.approx(value, abs=1e-6), (r["task"], name)
    if family == "flava":
        assert record["retrieval"] == {"method": "contrastive", "k": 0, "first_stage": None}
    else:
        want = {"method": "first_stage_top_k_reranked_by_itm", "k": 3, "first_stage": model_name(clip)}
        assert record["retrieval"] == want
        assert record["first_stage"]["model"] == model_name(clip) and record["first_stage"]["trained"] is False
        assert record["config"]["run"]["first_stage"] == model_name(clip)  # no local path in run.json
    # Not vacuous: some recall is neither 0 nor 1, and the ITM deltas run beside the ranking.
    assert any(0 < v < 1 for k, v in final.items() if "recall@" in k)
    assert {"itm/IR_c_mean", "itm/TR_c_mean", "itm/IR_r_mean", "itm/TR_r_mean"} <= final.keys()


@pytest.mark.parametrize("family", ["bridgetower", "vilt"])
def test_train_eval_only_without_a_first_stage_scores_the_deltas_and_names_the_flag(
    family, builds, tiny_families_dir, tmp_path, caplog
):
    folder = tiny_families_dir / family
    with caplog.at_level(logging.WARNING):
        assert _eval_only(folder, builds, tmp_path / "run") == 0
    said = [r.getMessage() for r in caplog.records if "first stage" in r.getMessage()]
    assert len(said) == 1 and "give --first-stage MODEL" in said[0] and "ITM deltas" in said[0], said
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["retrieval"] is None and "first_stage" not in record
    final = record["final_metrics"]
    assert {"itm/IR_c_mean", "itm/TR_c_mean", "itm/IR_r_mean", "itm/TR_r_mean"} <= final.keys()
    assert not [k for k in final if k.startswith(("zeroshot_retrieval/", "odmap/"))]


@pytest.mark.parametrize("family", ["vilt", "flava"])
def test_training_vilt_or_flava_is_refused_in_one_line_naming_eval_only(
    family, builds, tiny_families_dir, tmp_path, capsys
):
    cc, _, cf = builds
    argv = ["train", "--real", str(cc), "--real-train-splits", "test", "--counterfactuals", str(cf)]
    argv += ["--model", str(tiny_families_dir / family), "--output", str(tmp_path / "run"), "--report-to", "none"]
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--eval-only" in err and "BridgeTower" in err, err
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.parametrize(
    ("model", "first_stage", "words"),
    [
        ("clip", "clip", "its own embeddings"),
        ("flava", "clip", "its own contrastive head"),
        ("vilt", "vilt", "without embeddings"),  # a first stage has embeddings (a CLIP's, BLIP's, ...)
    ],
)
def test_a_first_stage_the_model_cannot_use_is_refused_in_one_line(
    model, first_stage, words, builds, tiny_families_dir, tiny_models_dir, tmp_path, capsys
):
    from builders.models.profiles import tiny_profile

    clip = str(tiny_profile(tiny_models_dir).clip)
    folders = {"clip": clip, "flava": str(tiny_families_dir / "flava"), "vilt": str(tiny_families_dir / "vilt")}
    folders["blip"] = str(tiny_families_dir / "blip")
    capsys.readouterr()
    assert _eval_only(folders[model], builds, tmp_path / "run", "--first-stage", folders[first_stage]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--first-stage" in err and words in err, err
