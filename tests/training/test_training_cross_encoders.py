"""Finetuning BLIP and BridgeTower through the CLIP trainer (#53): `counterfactory train --backend
blip|bridgetower` and `accelerate launch training/finetune_clip.py` on the tiny random-init
checkpoints. The loss falls on a fixed batch, the saved folder loads with `from_pretrained` where
counterfactory cannot be imported and scores differently from the base, a killed run resumes at
the same step with the same batches and negatives, and the hard negatives follow BLIP's sampler
(checked against an independent one)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.app.cli import main as cli_main
from training.finetune_clip import main as train_main
from training.itm_objectives import sample_hard_negatives, same_image

from helpers.build_helpers import ACCELERATE, accelerate_cmd
from helpers.training_helpers import COLORS, REAL_FEATURES, REPO_ROOT, SCRIPT, kill_at_checkpoint, png, read_jsonl
from helpers.training_helpers import tiny_args, weights, write_color_set, write_counterfactuals, write_split


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    """16 training images (2 per colour, 5 captions each: 80 examples), 16 test images, 8
    counterfactual pairs held out for the ITM deltas, and split `one` of 8 images of one caption
    each (the fixed batch)."""
    root = tmp_path_factory.mktemp("cross")
    data = write_color_set(root / "colors", {"train": 2, "test": 2})
    one = {"image": [], "image_id": [], "caption_ids": [], "captions": []}
    for k, (name, rgb) in enumerate(COLORS.items()):
        one["image"].append({"bytes": png(rgb, noise=20, seed=500 + k), "path": None})
        one["image_id"].append(500 + k)
        one["caption_ids"].append([5000 + k])
        one["captions"].append([f"a {name} picture"])
    write_split(data, "one", one, REAL_FEATURES)
    cf = write_counterfactuals(root / "cf", list(range(1, 9)))
    return data, cf


def _args(colors, tiny_models_dir, out: Path, family: str, *extra: str) -> list[str]:
    data, cf = colors
    args = tiny_args(data, tiny_models_dir, out, "--backend", family, "--counterfactuals", str(cf))
    if "--real-val-split" not in extra:
        args += ["--real-val-split", ""]
    return [*args, "--report-to", "none", "--bootstrap", "20", *extra]


def test_hard_negatives_are_never_the_positive_and_follow_the_softmax_weights():
    # 6 examples of 4 images (rows 0 and 1 show one image, as COCO's captions of one image).
    keys = torch.tensor([7, 7, 3, 5, 9, 3])
    sim = torch.tensor(np.random.default_rng(0).normal(size=(6, 6)) * 2, dtype=torch.float32)
    same = same_image(keys)
    draws = 20_000
    generator = torch.Generator().manual_seed(1234)
    texts = np.zeros((draws, 6), np.int64)
    images = np.zeros((draws, 6), np.int64)
    for d in range(draws):
        t, i = sample_hard_negatives(sim, same, generator)
        texts[d], images[d] = t.numpy(), i.numpy()
    mask = same.numpy()
    rows = np.arange(6)
    # Never a pair of the same image (the positive, or another caption of its image).
    assert not mask[rows[None, :], texts].any() and not mask[images, rows[None, :]].any()
    # The independent reference: BLIP's weights by numpy (softmax, same-image cells zeroed,
    # renormalised as torch.multinomial does), drawn by numpy's own generator.
    s = sim.numpy().astype(np.float64)
    rng = np.random.default_rng(99)
    for table, drawn in ((s, texts), (s.T, images)):
        w = np.exp(table - table.max(1, keepdims=True))
        w = np.where(mask, 0, w / w.sum(1, keepdims=True))
        p = w / w.sum(1, keepdims=True)
        for r in range(6):
            ours = np.bincount(drawn[:, r], minlength=6) / draws
            ref = np.bincount(rng.choice(6, size=draws, p=p[r]), minlength=6) / draws
            # 4.5 standard errors of a frequency of `draws` draws: the two samplers agree.
            bound = 4.5 * np.sqrt(p[r] * (1 - p[r]) / draws) + 1e-9
            assert np.all(np.abs(ours - p[r]) <= bound), (r, ours, p[r])
            assert np.all(np.abs(ref - p[r]) <= bound), (r, ref, p[r])


def test_a_batch_of_one_image_has_no_negative_and_says_so():
    from builders.engine.errors import UserFacingError

    keys = torch.tensor([4, 4, 4])
    with pytest.raises(UserFacingError, match="single image"):
        sample_hard_negatives(torch.zeros(3, 3), same_image(keys), torch.Generator().manual_seed(0))


def test_the_blip_recipe_halves_the_lr_every_half_epoch():
    from training.options import build_parser, config_from_args
    from training.trainer import lr_lambda

    cfg = config_from_args(
        build_parser().parse_args(["--real", "x", "--decorrelation", "y", "--recipe", "kim2023-blip"])
    )
    o = cfg.optim
    assert (o.epochs, o.batch_size, o.optimizer, o.lr, cfg.run.backend, cfg.data.mix) == (
        2,
        16,
        "adamw",
        1e-5,
        "blip",
        "decorrelation",
    )
    assert cfg.run.model == "Salesforce/blip-itm-base-coco"
    factor = lr_lambda(cfg, steps_per_epoch=10, total_steps=20)
    assert [factor(s) for s in (0, 4, 5, 9, 10, 15, 19)] == [1, 1, 0.5, 0.5, 0.25, 0.125, 0.125]


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["blip", "bridgetower"])
def test_cli_lowers_the_loss_on_a_fixed_batch_and_saves_a_model_transformers_loads(
    family, colors, tiny_models_dir, tiny_families_dir, tmp_path
):
    # One batch of all 8 examples, also the validation set: the loss of that fixed batch with
    # fixed negatives (seed 0) before step 1 and after the last.
    out = tmp_path / "run"
    extra = ("--real-train-splits", "one", "--real-val-split", "one", "--batch-size", "8", "--epochs", "10")
    extra += ("--lr", "1e-3", "--real-test-split", "")
    assert cli_main(["train", *_args(colors, tiny_models_dir, out, family, *extra)]) == 0
    before = json.loads((out / "before.json").read_text())["val_loss"]
    after = json.loads((out / "run.json").read_text())["final_metrics"]["val_loss"]
    assert after < before - 0.02, (before, after)
    curve = read_jsonl(out / "loss.jsonl")
    assert [r["step"] for r in curve] == list(range(1, 11))
    terms = {"blip": ("itc", "itm"), "bridgetower": ("itm",)}[family]
    for r in curve:  # each term logged, and the loss is their weighted sum
        assert math.isclose(r["loss"], sum(r[t] for t in terms), rel_tol=1e-5)
    record = json.loads((out / "run.json").read_text())
    assert record["objective"]["weights"] == {t: 1.0 for t in terms}
    assert "necessity" not in record  # no test split nor decorrelation build: no PN, so no s (as CLIP's)
    # The before -> after table of the ITM deltas in the card, and the objective stated.
    card = (out / "final" / "README.md").read_text()
    assert "## Before -> after" in card and "itm/IR\\_c\\_mean" in card
    assert "## Objective" in card and ("momentum encoder" in card or family == "bridgetower")
    # from_pretrained in a process where counterfactory cannot be imported: same class, and its
    # scores of a pair differ from the base model's.
    code = f"""
import sys, json
for name in ("builders", "training", "counterfactory_metrics", "loading_scripts"):
    sys.modules[name] = None
import torch, transformers
from PIL import Image
cls = getattr(transformers, json.load(open(sys.argv[1] + "/config.json"))["architectures"][0])
image = Image.new("RGB", (40, 40), (220, 30, 30))
out = []
for folder in sys.argv[1:]:
    model = cls.from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    with torch.no_grad():
        res = model(**processor(images=[image, image], text=["a red picture", "a blue cube"], return_tensors="pt", padding=True))
    out.append((res.itm_score if {family == "blip"} else res.logits).tolist())
print(json.dumps([cls.__name__, out]))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(out / "final"), str(tiny_families_dir / family)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    name, (trained, base) = json.loads(done.stdout.strip().splitlines()[-1])
    assert name == {"blip": "BlipForImageTextRetrieval", "bridgetower": "BridgeTowerForImageAndTextRetrieval"}[family]
    assert np.abs(np.asarray(trained) - np.asarray(base)).max() > 1e-3
    # `counterfactory benchmark --model` scores the saved folder.
    bench = tmp_path / "bench"
    argv = ["benchmark", "--model", str(out / "final"), "--counterfactuals", str(colors[1]), "--output", str(bench)]
    argv += ["--blind-lm", "none", "--bootstrap", "20", "--no-plots", "--cache-dir", str(tmp_path / "cache")]
    assert cli_main(argv) == 0


@pytest.mark.e2e
def test_blip_killed_under_accelerate_launch_resumes_at_the_same_step_with_the_same_batches(
    colors, tiny_models_dir, tmp_path
):
    # 80 examples / batch 16 = 5 steps an epoch; 8 steps, killed after the step-4 checkpoint.
    extra = ("--max-steps", "8", "--epochs", "2", "--save-every", "2", "--real-test-split", "", "--lr", "1e-3")
    killed = tmp_path / "killed"
    # One CPU process (accelerate's single-process launcher: `--multi_gpu` needs two).
    launch = [str(ACCELERATE), "launch", "--cpu", "--num_processes", "1", "--mixed_precision", "no"]
    cmd = [*launch, "--dynamo_backend", "no", str(SCRIPT), *_args(colors, tiny_models_dir, killed, "blip", *extra)]
    kill_at_checkpoint(cmd, killed, 4)
    at_kill = read_jsonl(killed / "loss.jsonl")
    assert train_main(_args(colors, tiny_models_dir, killed, "blip", *extra, "--resume", "latest")) == 0
    straight = tmp_path / "straight"
    assert train_main(_args(colors, tiny_models_dir, straight, "blip", *extra)) == 0
    resumed, uninterrupted = read_jsonl(killed / "loss.jsonl"), read_jsonl(straight / "loss.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted] == list(range(1, 9))
    # Same batches and the same negatives: every term of every step equal.
    for term in ("loss", "itc", "itm"):
        np.testing.assert_allclose([r[term] for r in resumed], [r[term] for r in uninterrupted], atol=1e-5)
    assert [r["loss"] for r in resumed[:4]] == [r["loss"] for r in at_kill[:4]]
    resumed_w, straight_w = weights(killed / "final"), weights(straight / "final")
    assert resumed_w.keys() == straight_w.keys()
    for name, w in straight_w.items():
        np.testing.assert_allclose(resumed_w[name], w, atol=1e-5, err_msg=name)


def test_a_clip_checkpoint_under_backend_blip_is_refused(colors, tiny_models_dir, tmp_path):
    from helpers.training_helpers import PYTHON

    clip = tiny_models_dir / "clip"
    args = _args(colors, tiny_models_dir, tmp_path / "out", "blip", "--model", str(clip), "--max-steps", "1")
    done = subprocess.run([PYTHON, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode != 0
    assert "--backend blip trains a blip checkpoint" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_blip_itc_is_the_gathered_batchs_on_two_processes(colors, tiny_models_dir, tmp_path):
    # The ITC of step 1 (the same weights, the same global batch) on 2 processes equals 1
    # process's: every process computes the gathered batch's; the ITM is of each process's batch.
    extra = ("--max-steps", "1", "--real-test-split", "")
    two, one = tmp_path / "two", tmp_path / "one"
    cmd = accelerate_cmd(SCRIPT, *_args(colors, tiny_models_dir, two, "blip", *extra, "--expect-processes", "2"))
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert train_main(_args(colors, tiny_models_dir, one, "blip", *extra)) == 0
    (a,), (b,) = read_jsonl(two / "loss.jsonl"), read_jsonl(one / "loss.jsonl")
    assert a["itc"] == pytest.approx(b["itc"], abs=1e-6)


def test_the_bridgetower_recipe_is_le2023s_stated_hyperparameters_on_bridgetower():
    """Le et al. 2023 Appendix B.3.2: AdamW lr 5e-7, weight decay 0.001, batch 128; Appendix A.1:
    the best checkpoint on the development set; the model is their bridgetower-large-itm-mlm-itc."""
    from training.options import build_parser, config_from_args

    cfg = config_from_args(
        build_parser().parse_args(["--real", "x", "--counterfactuals", "y", "--recipe", "le2023-bridgetower"])
    )
    o = cfg.optim
    assert (o.optimizer, o.lr, o.weight_decay, o.batch_size) == ("adamw", 5e-7, 0.001, 128)
    assert (cfg.run.backend, cfg.run.best_by_val_loss) == ("bridgetower", True)
    assert cfg.run.model == "BridgeTower/bridgetower-large-itm-mlm-itc"


@pytest.mark.e2e
def test_blip_training_evaluates_recall_before_and_after_by_the_benchmarks_reranking(
    colors, tiny_models_dir, tmp_path
):
    # One step on the colour set, its 16 test images x 80 captions ranked before and after by
    # training/rerank.py (BLIP's ITC top 256 re-ranked by ITM + ITC: every pair, k >= gallery).
    out = tmp_path / "run"
    assert cli_main(["train", *_args(colors, tiny_models_dir, out, "blip", "--max-steps", "1", "--epochs", "1")]) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["retrieval"] == {"method": "itc_top_k_reranked_by_itm_plus_itc", "k": 256, "first_stage": None}
    recalls = [f"zeroshot_retrieval/{d}_retrieval_recall@{k}" for d in ("text", "image") for k in (1, 5, 10)]
    before = json.loads((out / "before.json").read_text())
    for name in recalls:
        assert 0 <= before[name] <= 1 and 0 <= record["final_metrics"][name] <= 1, name
        row = record["before_after"][name]
        assert row["difference"] == pytest.approx(record["final_metrics"][name] - before[name])
    assert "zeroshot\\_retrieval/text\\_retrieval\\_recall@1" in (out / "final" / "README.md").read_text()


@pytest.mark.e2e
def test_bridgetower_training_reranks_a_fixed_first_stage_before_and_after(colors, tiny_models_dir, tmp_path):
    # One BridgeTower step with --first-stage (the tiny CLIP) and --rerank-k 5: R@K before and
    # after, each the ITM head's order of the same CLIP's top 5 (the first stage is not trained).
    from builders.engine.provenance import model_name
    from builders.models.profiles import tiny_profile

    clip, out = str(tiny_profile(tiny_models_dir).clip), tmp_path / "run"
    extra = ("--max-steps", "1", "--epochs", "1", "--lr", "1e-3", "--first-stage", clip, "--rerank-k", "5")
    assert cli_main(["train", *_args(colors, tiny_models_dir, out, "bridgetower", *extra)]) == 0
    record = json.loads((out / "run.json").read_text())
    want = {"method": "first_stage_top_k_reranked_by_itm", "k": 5, "first_stage": model_name(clip)}
    assert record["retrieval"] == want
    assert record["first_stage"]["trained"] is False and record["first_stage"]["model"] == model_name(clip)
    before = json.loads((out / "before.json").read_text())
    for d in ("text", "image"):
        name = f"zeroshot_retrieval/{d}_retrieval_recall@1"
        assert 0 <= before[name] <= 1 and record["before_after"][name]["difference"] == pytest.approx(
            record["final_metrics"][name] - before[name]
        )
    with np.load(out / "embeddings_before.npz") as b, np.load(out / "embeddings.npz") as a:
        # The same first-stage embeddings and candidates, re-ranked by the trained ITM head.
        for key in ("first_image", "first_text", "rr_i2t_idx", "rr_t2i_idx"):
            np.testing.assert_array_equal(b[key], a[key], err_msg=key)
        assert b["rr_i2t_idx"].shape[1] == 5
        assert np.abs(b["rr_i2t_score"] - a["rr_i2t_score"]).max() > 1e-4
    card = (out / "final" / "README.md").read_text()
    line = next(x for x in card.splitlines() if x.startswith("Retrieval metrics"))
    assert "k = 5" in line and "first stage" in line and "not trained" in line, line


def test_a_checkpoint_naming_its_contrastive_head_trains_the_itm_head(tiny_families_dir):
    """BridgeTower/bridgetower-large-itm-mlm-itc, the trainer's default BridgeTower, names
    BridgeTowerForContrastiveLearning in its config.json: training loads the family's retrieval
    (ITM) head from it, while --eval-only scores the head the config names."""
    from types import SimpleNamespace

    from builders.models.clip_ids import ClipId
    from training.cross_training import CrossEncoderTraining, load_training_backend

    folder = str(tiny_families_dir / "bridgetower-itc")
    clip = ClipId("transformers", folder, folder)
    trained = load_training_backend(clip, "bridgetower")
    assert isinstance(trained, CrossEncoderTraining)
    assert trained.architecture == "BridgeTowerForImageAndTextRetrieval"
    scored = load_training_backend(clip, "bridgetower", SimpleNamespace(first_stage=None, eval_only=True))
    assert scored.architecture == "BridgeTowerForContrastiveLearning"
