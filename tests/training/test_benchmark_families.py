"""`counterfactory benchmark` scores BLIP, BridgeTower, ViLT and FLAVA (#51): each pair's G is the
model's own ITM output as its reference reads it, checked here against a forward call written
from the references (one pair a call, as the COCO-Counterfactuals scoring script does), and the
ITM records say which G they used."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from builders.app.cli import main as cli_main
from helpers.training_helpers import read_jsonl, write_counterfactuals

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def _blip(model, inputs):
    return model(**inputs, use_itm_head=True).itm_score[0, 1]  # BLIP's evaluation: itm_head(...)[:, 1]


def _bridgetower(model, inputs):
    return model(**inputs).logits[0, 1]  # the COCO-Counterfactuals script


def _bridgetower_itc(model, inputs):
    # Its forward's `logits_text_to_image` (what its loss reads): the logit scale times the cosine.
    out = model(**inputs)
    return (model.logit_scale.exp() * out.text_embeds @ out.image_embeds.T)[0, 0]


def _vilt(model, inputs):
    return model(**inputs).logits[0, 0]  # the COCO-Counterfactuals script


def _flava(model, inputs):
    return model(**inputs, input_ids_masked=inputs["input_ids"], return_loss=False).itm_logits[0, 1]


def _flava_itc(model, inputs):
    # FlavaModel's weights loaded as FlavaForPreTraining (its `flava`): the contrastive logits its
    # forward computes for its global contrastive loss, the logit scale times the cosine.
    return model(**inputs, input_ids_masked=inputs["input_ids"], return_loss=False).contrastive_logits_per_text[0, 0]


#: family -> (transformers class, the reference's G of one pair, the records' g_kind)
REFERENCES = {
    "blip": ("BlipForImageTextRetrieval", _blip, "blip_itm_logit"),
    "bridgetower": ("BridgeTowerForImageAndTextRetrieval", _bridgetower, "bridgetower_itm_logit"),
    "bridgetower-itc": ("BridgeTowerForContrastiveLearning", _bridgetower_itc, "bridgetower_itc_logit"),
    "vilt": ("ViltForImageAndTextRetrieval", _vilt, "vilt_itm_logit"),
    "flava": ("FlavaForPreTraining", _flava, "flava_itm_logit"),
    "flava-itc": ("FlavaForPreTraining", _flava_itc, "flava_itc_logit"),
}


@pytest.fixture(scope="module")
def cf_pairs(tmp_path_factory):
    return write_counterfactuals(tmp_path_factory.mktemp("cf") / "cf", list(range(1, 9)))


def _reference_scores(folder, cls: str, score, cf) -> dict[str, np.ndarray]:
    """The three scores of each pair from the model's own call (`score(model, inputs)`, the model
    loaded as transformers' `cls`): G(C_c, I_c), G(C_c, I_o), G(C_o, I_c)."""
    import transformers
    from datasets import load_dataset

    model = getattr(transformers, cls).from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    rows = load_dataset(str(cf), split="test")

    def g(image: dict, caption: str) -> float:
        img = Image.open(io.BytesIO(image["bytes"])).convert("RGB")
        with torch.no_grad():
            return float(score(model, processor(images=img, text=caption, return_tensors="pt")))

    out: dict[str, list[float]] = {"g_cc_ics": [], "g_cc_ios": [], "g_co_ics": []}
    for row in rows.cast_column("image_0", rows.features["image_0"].__class__(decode=False)).cast_column(
        "image_1", rows.features["image_1"].__class__(decode=False)
    ):
        out["g_cc_ics"].append(g(row["image_1"], row["caption_1"]))
        out["g_cc_ios"].append(g(row["image_0"], row["caption_1"]))
        out["g_co_ics"].append(g(row["image_1"], row["caption_0"]))
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.parametrize("family", [*sorted(REFERENCES), "bridgetower-unnamed"])
def test_each_pairs_g_is_the_models_own_itm_output(family, cf_pairs, tiny_families_dir, tmp_path):
    """`bridgetower-unnamed`: a config.json naming no architecture (as some Hub configs were
    written) is loaded with the family's ITM head, as COCO-Counterfactuals' script loads it."""
    folder = tiny_families_dir / family
    if family == "bridgetower-unnamed":
        import json
        import shutil

        family, folder = "bridgetower", shutil.copytree(tiny_families_dir / "bridgetower", tmp_path / family)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["benchmark", "--model", str(folder), "--counterfactuals", str(cf_pairs), "--output", str(out)]
    argv += [
        "--cache-dir",
        str(cache),
        "--blind-lm",
        "none",
        "--bootstrap",
        "50",
        "--no-plots",
        "--eval-batch-size",
        "6",
    ]
    assert cli_main(argv) == 0
    (entry,) = cache.glob("*.npz")
    with np.load(entry) as z:
        saved = {k.removeprefix("itm_"): z[k] for k in z.files if k.startswith("itm_")}
    ref = _reference_scores(folder, *REFERENCES[family][:2], cf_pairs)
    assert saved.keys() == ref.keys()
    for name, values in ref.items():
        # Batched with padding against one pair a call: equal to float32 rounding.
        np.testing.assert_allclose(saved[name], values, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.ptp(ref["g_cc_ics"]) > 0  # the pairs' scores differ: the check can tell them apart
    (itm,) = [r for r in read_jsonl(out / "results.jsonl") if r["task"] == "itm"]
    assert itm["g_kind"] == REFERENCES[family][2]
    assert itm["metrics"]["IR_c_mean"] == pytest.approx(np.mean(ref["g_cc_ics"] - ref["g_cc_ios"]), abs=1e-6)
    assert itm["metrics"]["TR_c_mean"] == pytest.approx(np.mean(ref["g_cc_ics"] - ref["g_co_ics"]), abs=1e-6)
    assert itm["ci_low"]["IR_c_mean"] is not None  # the same statistics as CLIP's


def test_a_cross_encoder_with_nothing_to_score_is_one_line(tmp_path, capsys, tiny_families_dir):
    """ViLT on --decorrelation alone, without --first-stage: nothing it can score (ODmAP needs a
    first stage to re-rank; --coco would give its real-pair deltas, --counterfactuals its own)."""
    argv = ["benchmark", "--model", str(tiny_families_dir / "vilt"), "--decorrelation", str(tmp_path / "none")]
    assert cli_main([*argv, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ViLT" in err and "--decorrelation" in err and "--first-stage" in err, err


def test_g_of_different_units_is_never_compared(cf_pairs, tiny_families_dir, tiny_models_dir, tmp_path):
    """A CLIP (cosine) and ViLT (its ITM logit) in one report, with --coco: ViLT is scored on the
    counterfactual pairs only, each ITM record names its G, and the comparison table leaves out
    the ITM deltas, saying why in one line."""
    from builders.models.profiles import tiny_profile

    clip, vilt = str(tiny_profile(tiny_models_dir).clip), str(tiny_families_dir / "vilt")
    out = tmp_path / "out"
    argv = ["benchmark", "--model", clip, "--model", vilt, "--counterfactuals", str(cf_pairs), "--output", str(out)]
    assert cli_main([*argv, "--blind-lm", "none", "--bootstrap", "50", "--no-plots"]) == 0
    records = [r for r in read_jsonl(out / "results.jsonl") if r["task"] == "itm"]
    assert sorted(r["g_kind"] for r in records) == ["cosine", "vilt_itm_logit"]
    report = (out / "report.md").read_text()
    assert "ITM deltas not compared between models: their G differ" in report
    assert "IR_c" not in report.split("## Comparison", 1)[-1].split("ITM deltas not compared")[0]


def _logits_per_text(model, inputs):
    return model(**inputs).logits_per_text[0, 0]  # the COCO-Counterfactuals script's CLIP G


@pytest.mark.parametrize("clip_g", ["logits_per_text", "cosine"])
def test_clip_g_is_its_logits_per_text_or_the_cosine(clip_g, cf_pairs, tiny_models_dir, tmp_path):
    """`--clip-g logits_per_text`: each pair's G is CLIP's own `logits_per_text` (the logit scale
    times the cosine, as the COCO-Counterfactuals script scores CLIP); the default, the cosine,
    is the same divided by the scale. Each ITM record names its G."""
    from builders.models.profiles import tiny_profile

    clip = tiny_profile(tiny_models_dir).clip
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["benchmark", "--model", str(clip), "--counterfactuals", str(cf_pairs), "--output", str(out)]
    argv += ["--cache-dir", str(cache), "--blind-lm", "none", "--bootstrap", "50", "--no-plots", "--clip-g", clip_g]
    assert cli_main(argv) == 0
    (entry,) = cache.glob("*.npz")
    with np.load(entry) as z:
        saved = {k.removeprefix("itm_"): z[k] for k in z.files if k.startswith("itm_")}
    from transformers import CLIPModel

    ref = _reference_scores(clip, "CLIPModel", _logits_per_text, cf_pairs)
    scale = float(CLIPModel.from_pretrained(clip).logit_scale.exp().detach())
    assert scale > 1  # the two G differ: the check tells them apart
    for name, values in ref.items():
        want = values if clip_g == "logits_per_text" else values / scale
        # The pixels are the processor's within one grey level (training/backends.py PixelPipeline).
        np.testing.assert_allclose(saved[name], want, rtol=1e-3, atol=1e-3 * abs(want).max(), err_msg=name)
    (itm,) = [r for r in read_jsonl(out / "results.jsonl") if r["task"] == "itm"]
    assert itm["g_kind"] == clip_g
    # A second run with the other G is a cache miss: the entries are keyed on it.
    other = "cosine" if clip_g == "logits_per_text" else "logits_per_text"
    argv[argv.index(clip_g)] = other
    argv[argv.index(str(out))] = str(tmp_path / "out2")
    assert cli_main(argv) == 0
    assert len(list(cache.glob("*.npz"))) == 2


def test_the_results_dataset_keeps_each_g_apart(cf_pairs, tiny_models_dir, repo_id, tmp_path):
    """`--push-to-hub` of a CLIP's cosine deltas, then of its logits_per_text deltas: the second
    push adds its ITM row (a record of another G, not one already there), and each row of the
    results dataset names its G."""
    from datasets import load_dataset

    from builders.models.profiles import tiny_profile

    clip = str(tiny_profile(tiny_models_dir).clip)
    argv = ["benchmark", "--model", clip, "--counterfactuals", str(cf_pairs), "--push-to-hub", repo_id]
    argv += ["--blind-lm", "none", "--bootstrap", "50", "--no-plots", "--cache-dir", str(tmp_path / "cache")]
    assert cli_main([*argv, "--output", str(tmp_path / "cos")]) == 0
    assert cli_main([*argv, "--output", str(tmp_path / "logits"), "--clip-g", "logits_per_text"]) == 0
    rows = load_dataset(repo_id, split="train", download_mode="force_redownload")
    itm = sorted((r["g_kind"], r["metrics"]) for r in rows if r["task"] == "itm")
    assert [g for g, _ in itm] == ["cosine", "logits_per_text"] and itm[0][1] != itm[1][1]


def test_a_cross_encoder_beside_coco_gets_its_itm_deltas_and_one_line(
    tmp_path, coco_fixture_dir, nltk_data_dir, tiny_families_dir, tiny_models_dir, caplog, monkeypatch
):
    """ViLT beside a CLIP on --coco and --counterfactuals, without --first-stage: one logged line
    says ViLT's retrieval is not scored, its ITM deltas are (the real pairs' on --coco too, and
    CLIP's every metric); a second report with the same cache scores no pair again (the entry is
    per model, data and G)."""
    import logging

    import builders.models.cross_encoders as cross_encoders
    from builders.models.profiles import tiny_profile
    from helpers.training_helpers import report_builds

    cc, _, cf = report_builds(tmp_path / "builds", coco_fixture_dir)
    clip, vilt = str(tiny_profile(tiny_models_dir).clip), str(tiny_families_dir / "vilt")
    argv = ["benchmark", "--model", clip, "--model", vilt, "--coco", str(cc), "--counterfactuals", str(cf)]
    argv += ["--blind-lm", "none", "--bootstrap", "50", "--no-plots", "--cache-dir", str(tmp_path / "cache")]
    with caplog.at_level(logging.WARNING):
        assert cli_main([*argv, "--output", str(tmp_path / "out")]) == 0
    said = [r.getMessage() for r in caplog.records if vilt in r.getMessage()]
    assert len(said) == 1 and "--coco" in said[0] and "ITM deltas" in said[0], said
    records = read_jsonl(tmp_path / "out" / "results.jsonl")
    from builders.engine.provenance import model_name

    vilt_tasks = {(r["dataset"], r["task"]) for r in records if r["model"] == model_name(vilt)}
    assert vilt_tasks == {("counterfactuals", "itm"), ("coco", "itm")}
    assert {"zeroshot_retrieval", "itm"} <= {r["task"] for r in records if r["model"] == model_name(clip)}
    scored = []
    score = cross_encoders.counterfactual_pair_scores
    monkeypatch.setattr(cross_encoders, "counterfactual_pair_scores", lambda *a: scored.append(1) or score(*a))
    assert cli_main([*argv, "--output", str(tmp_path / "again")]) == 0
    assert scored == []
    again = read_jsonl(tmp_path / "again" / "results.jsonl")
    assert [r["metrics"] for r in again if r["model"] == model_name(vilt)] == [
        r["metrics"] for r in records if r["model"] == model_name(vilt)
    ]
