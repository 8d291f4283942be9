"""Object necessity PN of the cross-encoders through `counterfactory benchmark --coco
--decorrelation` (#51): PN = (s(x, y) - s(x', y)) / s(x, y) with s the NUIF paper's P(m | ...),
for a 2-way ITM head its match probability, softmax(logits)[:, 1]. Each pair's s and each PN are
checked against the model's own transformers call, one pair a call, with the removal pairs read
here from the builds' own tables; ViLT (one logit, no probability) is refused in one line. The
trainer's --eval-only (`python training/finetune_clip.py`) gives the same PN."""

from __future__ import annotations

import json
import logging
import subprocess

import numpy as np
import pytest
import torch

import training.rerank as rerank
from builders.app.cli import main as cli_main
from helpers.training_helpers import PYTHON, REPO_ROOT, SCRIPT, read_jsonl, report_builds

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

COMMON = ["--blind-lm", "none", "--bootstrap", "50", "--no-plots", "--eval-batch-size", "7"]


def _blip(model, x):
    return model(**x, use_itm_head=True).itm_score  # BLIP's demo: softmax(itm_output, dim=1)[:, 1]


def _bridgetower(model, x):
    return model(**x).logits


def _flava(model, x):
    return model(**x, input_ids_masked=x["input_ids"], return_loss=False).itm_logits


def _match(logits):
    return lambda model, x: torch.softmax(logits(model, x), 1)[0, 1]


def _mapped_cosine(model, x):  # BridgeTower's contrastive head: a dual encoder's s, as CLIP's
    out = model(**x)
    return ((out.text_embeds * out.image_embeds).sum(-1)[0] + 1) / 2


def _flava_mapped_cosine(model, x):  # FlavaModel's weights read by FlavaForPreTraining
    out = model(**x, input_ids_masked=x["input_ids"], return_loss=False)
    return (out.contrastive_logits_per_text[0, 0] / model.flava.logit_scale.exp() + 1) / 2


#: family -> (transformers class, s of one pair from its own call, the records' s_kind)
ITM = {
    "blip": ("BlipForImageTextRetrieval", _match(_blip), "blip_itm_match_probability"),
    "bridgetower": ("BridgeTowerForImageAndTextRetrieval", _match(_bridgetower), "bridgetower_itm_match_probability"),
    "bridgetower-itc": ("BridgeTowerForContrastiveLearning", _mapped_cosine, "cosine_mapped_to_0_1"),
    "flava": ("FlavaForPreTraining", _match(_flava), "flava_itm_match_probability"),
    "flava-itc": ("FlavaForPreTraining", _flava_mapped_cosine, "cosine_mapped_to_0_1"),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    return report_builds(tmp_path_factory.mktemp("builds"), coco_fixture_dir)


def _removal_pairs(cc, dec) -> list[tuple]:
    """(x, x', y, classes) of every decorrelation query whose source image is in the coco test
    split, each original caption y of it that mentions a class it removed, in query order."""
    from datasets import load_dataset

    test = load_dataset(str(cc), "default", split="test")
    source = {i: img.convert("RGB") for i, img in zip(test["image_id"], test["image"], strict=True)}
    queries = load_dataset(str(dec), "odmap_queries", split="test")
    gallery = load_dataset(str(dec), "odmap_gallery", split="test")
    caption = {
        c: (t, set(m))
        for c, t, m in zip(gallery["caption_id"], gallery["caption"], gallery["mentioned_classes"], strict=True)
    }
    out = []
    for q in queries:
        for c in q["caption_ids"] if q["image_id"] in source else ():
            if c in caption and set(q["removed_classes"]) & caption[c][1]:
                text, mentions = caption[c]
                x_removed = q["image"].convert("RGB")
                out.append((source[q["image_id"]], x_removed, text, sorted(set(q["removed_classes"]) & mentions)))
    return out


def _reference(folder, family: str, pairs: list) -> tuple[np.ndarray, dict[str, list[float]]]:
    """(pairs, 2): s(x, y), s(x', y) from the model's own call (a softmax, or BridgeTower's
    contrastive head's mapped cosine); PN per class."""
    import transformers

    cls, s_of, _ = ITM[family]
    model = getattr(transformers, cls).from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    s = np.zeros((len(pairs), 2))
    pn: dict[str, list[float]] = {}
    with torch.no_grad():
        for n, (x, x_removed, y, classes) in enumerate(pairs):
            for j, image in enumerate((x, x_removed)):
                s[n, j] = float(s_of(model, processor(images=image, text=y, return_tensors="pt")))
            for c in classes:
                pn.setdefault(c, []).append((s[n, 0] - s[n, 1]) / s[n, 0])
    return s, pn


@pytest.mark.parametrize("family", ["blip", "bridgetower", "bridgetower-itc", "flava", "flava-itc"])
def test_cross_encoder_pn_is_its_match_probability(
    family, builds, tiny_families_dir, tiny_models_dir, tmp_path, monkeypatch, request
):
    """Each pair's s in the cache and each PN in the records equal the model's own softmax; the
    PN record says which s, with its interval and floor (FLAVA: also in the results dataset).
    BLIP beside a CLIP: PN not compared (s differ), in one line; a second report scores no pair
    again."""
    from builders.models.profiles import tiny_profile

    cc, dec, _ = builds
    folder, clip = tiny_families_dir / family, str(tiny_profile(tiny_models_dir).clip)
    models = ["--model", str(folder), *(["--model", clip] if family == "blip" else [])]
    argv = ["benchmark", *models, "--coco", str(cc), "--decorrelation", str(dec), "--cache-dir", str(tmp_path / "c")]
    push = ["--push-to-hub", request.getfixturevalue("repo_id")] if family == "flava" else []
    assert cli_main([*argv, *push, "--output", str(tmp_path / "out"), *COMMON]) == 0
    pairs = _removal_pairs(cc, dec)
    want_s, want_pn = _reference(folder, family, pairs)
    assert len(pairs) >= 2 and np.ptp(want_s) > 0
    # Not vacuous: x and x' score apart (the tiny BLIP barely sees the image: its PN is 0 to 1e-7).
    assert family == "blip" or np.abs(want_s[:, 0] - want_s[:, 1]).max() > 1e-4
    (entry,) = (tmp_path / "c").glob("necessity-*.npz")
    with np.load(entry) as z:
        np.testing.assert_allclose(z["s"], want_s, rtol=1e-5)
    assert json.loads(entry.with_suffix(".json").read_text())["key"]["s_kind"] == ITM[family][2]
    records = read_jsonl(tmp_path / "out" / "results.jsonl")
    pn = [r for r in records if r["task"] == "necessity"]
    mine = [r for r in pn if r["s_kind"] == ITM[family][2]]
    assert len(mine) == 1
    got = mine[0]["metrics"]
    assert set(got) == {"PN_mean", *(f"PN_{c}" for c in want_pn)}
    for c, values in want_pn.items():
        assert got[f"PN_{c}"] == pytest.approx(np.mean(values), rel=1e-5, abs=1e-7), c
    assert got["PN_mean"] == pytest.approx(np.mean([v for vs in want_pn.values() for v in vs]), rel=1e-5, abs=1e-7)
    assert mine[0]["ci_low"]["PN_mean"] is not None and mine[0]["chance"]["PN_mean"] is not None
    if push:
        from datasets import load_dataset

        rows = load_dataset(push[1], split="train", download_mode="force_redownload")
        assert [(r["s_kind"], json.loads(r["metrics"])) for r in rows if r["task"] == "necessity"] == [
            (ITM[family][2], got)
        ]
    if family == "blip":
        assert sorted(r["s_kind"] for r in pn) == ["blip_itm_match_probability", "cosine_mapped_to_0_1"]
        report = (tmp_path / "out" / "report.md").read_text()
        assert report.count("PN not compared between models: their s differ") == 1
        assert not [line for line in report.splitlines() if line.startswith("| necessity/")]  # no paired test
    scored = []
    score = rerank.PairPool.score
    monkeypatch.setattr(rerank.PairPool, "score", lambda *a, **k: scored.append(1) or score(*a, **k))
    assert cli_main([*argv, "--output", str(tmp_path / "again"), *COMMON]) == 0
    assert scored == []
    again = [r["metrics"] for r in read_jsonl(tmp_path / "again" / "results.jsonl") if r["task"] == "necessity"]
    assert again == [r["metrics"] for r in pn]


def _train_eval_only(folder, builds, out, *extra: str) -> subprocess.CompletedProcess:
    """`python training/finetune_clip.py --eval-only --model folder` on the coco build's test split
    (the queries' x), the decorrelation build and the counterfactuals, as a stranger runs it."""
    cc, dec, cf = builds
    argv = ["--real", str(cc), "--decorrelation", str(dec), "--counterfactuals", str(cf), "--model", str(folder)]
    argv += ["--eval-only", "--num-workers", "0", "--eval-batch-size", "7", "--report-to", "none", "--bootstrap", "50"]
    cmd = [PYTHON, str(SCRIPT), *argv, "--output", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)


@pytest.mark.parametrize("family", ["bridgetower", "bridgetower-itc", "flava", "flava-itc"])
def test_train_eval_only_pn_of_a_cross_encoder_is_the_benchmarks(family, builds, tiny_families_dir, tmp_path):
    """The trainer's --eval-only PN of a cross-encoder (its s: the ITM head's match probability, or
    a contrastive head's mapped cosine) equals `counterfactory benchmark`'s for the same model and
    data and the model's own transformers call, with CLIP's metric names, per-unit intervals and
    run.json's `s_kind`; the other metrics still come out. Both 2-way ITM heads that rank
    differently (BridgeTower's, FLAVA's `itm_logits`) and both contrastive heads (BridgeTower's,
    and FlavaModel read by FlavaForPreTraining). BLIP's ITM head shares FLAVA's path but is left
    out: the tiny BLIP barely sees the image (its PN is 0 to 1e-7), so the not-vacuous check fails."""
    cc, dec, _ = builds
    folder = tiny_families_dir / family
    bench = ["benchmark", "--model", str(folder), "--coco", str(cc), "--decorrelation", str(dec)]
    assert cli_main([*bench, "--output", str(tmp_path / "bench"), *COMMON]) == 0
    (benchmark,) = [r for r in read_jsonl(tmp_path / "bench" / "results.jsonl") if r["task"] == "necessity"]
    done = _train_eval_only(folder, builds, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    final = record["final_metrics"]
    pn = {k.removeprefix("necessity/"): v for k, v in final.items() if k.startswith("necessity/")}
    _, want = _reference(folder, family, _removal_pairs(cc, dec))
    assert set(pn) == set(benchmark["metrics"]) == {"PN_mean", *(f"PN_{c}" for c in want)}
    assert record["necessity"] == {"s_kind": ITM[family][2]} and benchmark["s_kind"] == ITM[family][2]
    for name, value in benchmark["metrics"].items():
        assert pn[name] == pytest.approx(value, abs=1e-6), name
    for c, values in want.items():  # and the brute force of transformers' own call
        assert pn[f"PN_{c}"] == pytest.approx(np.mean(values), rel=1e-5, abs=1e-6), c
    # Not vacuous: x and x' score apart (not so the tiny BLIP, whose PN is ~0: left out here).
    assert max(abs(v) for v in pn.values()) > 1e-4
    # CLIP's per-unit scores (removal pairs, clustered by source image) and intervals: the
    # benchmark's (the same --bootstrap and seed), or the same reason for none (one cluster).
    notes = record.get("final_interval_notes") or {}
    for name in pn:
        if benchmark["ci_low"][name] is None:
            assert notes[f"necessity/{name}"] == "one cluster", name
        else:
            want_ci = [benchmark["ci_low"][name], benchmark["ci_high"][name]]
            assert record["final_intervals"][f"necessity/{name}"] == pytest.approx(want_ci, abs=1e-6), name
    assert "necessity/PN_mean" in record["final_intervals"]
    assert {"itm/IR_c_mean", "itm/TR_c_mean", "itm/IR_r_mean", "itm/TR_r_mean"} <= final.keys()
    said = f"Object necessity PN's s: {ITM[family][2]}.".replace("_", "\\_")  # markdown-escaped
    assert said in (tmp_path / "run" / "metrics.md").read_text().splitlines()


def test_train_eval_only_refuses_vilts_pn_in_one_line_and_scores_the_rest(builds, tiny_families_dir, tmp_path):
    done = _train_eval_only(tiny_families_dir / "vilt", builds, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "necessity" in line]
    assert len(said) == 1 and "no object necessity PN" in said[0] and "ViLT" in said[0], said
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["necessity"]["s_kind"] is None and "rank_output" in record["necessity"]["no_pn"]
    final = record["final_metrics"]
    assert not [k for k in final if k.startswith("necessity/")]
    assert {"itm/IR_c_mean", "itm/TR_c_mean", "itm/IR_r_mean", "itm/TR_r_mean"} <= final.keys()


def test_vilt_pn_is_refused_in_one_line_and_its_other_metrics_run(
    builds, tiny_families_dir, tiny_models_dir, tmp_path, caplog
):
    from builders.models.profiles import tiny_profile

    cc, dec, _ = builds
    folder, clip = tiny_families_dir / "vilt", str(tiny_profile(tiny_models_dir).clip)
    argv = ["benchmark", "--model", str(folder), "--first-stage", clip, "--coco", str(cc), "--decorrelation", str(dec)]
    with caplog.at_level(logging.WARNING):
        assert cli_main([*argv, "--output", str(tmp_path / "out"), *COMMON]) == 0
    said = [r.getMessage() for r in caplog.records if "necessity" in r.getMessage()]
    assert len(said) == 1 and "ViLT" in said[0] and "probability" in said[0], said
    tasks = {(r["dataset"], r["task"]) for r in read_jsonl(tmp_path / "out" / "results.jsonl")}
    assert {("coco", "zeroshot_retrieval"), ("coco", "itm"), ("decorrelation", "odmap")} <= tasks
    assert not [t for t in tasks if t[1] == "necessity"]


def test_a_head_without_s_is_refused_with_its_own_reason(caplog):
    """The refusal names the head's own reason (`no_s`): ViLT's for ViLT (above), a generic one
    for any other head without an s, never ViLT's."""
    from types import SimpleNamespace

    from builders.models.cross_encoders import CrossEncoder
    from training.report.necessity import object_necessity

    backend = SimpleNamespace(s_kind="", dual_encoder=False, module=CrossEncoder(None))
    with caplog.at_level(logging.WARNING):
        assert object_necessity(backend, "some-model", (None, None), {}, (None, (), 1)) is None
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("some-model: no object necessity PN") and "no match probability" in said, said
    assert "ViLT" not in said and "rank_output" not in said, said
