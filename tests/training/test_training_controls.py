"""The controls a user of open_clip_train or run_clip.py reaches for (issue #34 §4), each checked
against the reference it claims to follow: Adam's betas and eps per recipe (transformers'
`TrainingArguments`, `torch.optim.Adam`), open_clip_train's 1-D no-decay rule, SigLIP's sigmoid
loss (open_clip's `SigLipLoss`, full batch = accumulated, chosen by the model, the other refused),
the kept or dropped last batch (ceil / floor steps, 1 and 2 processes), open_clip's train
augmentation and the evaluation metrics on the trackers."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Features, Image, List, Value

from builders.app.cli import main as cli_main
from training.finetune_clip import main as train_main

from helpers.build_helpers import accelerate_cmd, error_line
from helpers.training_helpers import (
    COLORS,
    REPO_ROOT,
    SCRIPT,
    OneProcessAccelerator,
    png,
    read_jsonl,
    write_color_set,
    write_split,
)

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

REAL = Features(
    {
        "image": Image(),
        "image_id": Value("int64"),
        "caption_ids": List(Value("int64")),
        "captions": List(Value("string")),
    }
)


def _parse(*argv: str):
    from training.options import build_parser, config_from_args

    return config_from_args(build_parser().parse_args(["--real", "out/cc", "--output", "run", *argv]))


def real_set(root: Path, n_train: int, n_test: int = 2) -> Path:
    """A coco-captions-shaped folder with `n_train` train images of one caption each (so
    `n_train` training examples) and `n_test` test images."""
    names, image_id = list(COLORS), 1
    for split, n in (("train", n_train), ("test", n_test)):
        cols = {"image": [], "image_id": [], "caption_ids": [], "captions": []}
        for _ in range(n):
            name = names[image_id % len(names)]
            cols["image"].append({"bytes": png(COLORS[name], noise=20, seed=image_id), "path": None})
            cols["image_id"].append(image_id)
            cols["caption_ids"].append([image_id])
            cols["captions"].append([f"a {name} square number {image_id}"])
            image_id += 1
        write_split(root, split, cols, REAL)
    return root


def tiny_args(real: Path, out: Path, tiny_models_dir, *extra: str) -> list[str]:
    return [
        "--real",
        str(real),
        "--real-train-splits",
        "train",
        "--real-val-split",
        "",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--report-to",
        "none",
        "--lr",
        "1e-4",
        "--output",
        str(out),
        *extra,
    ]


def optimizer_groups(run: Path) -> list[dict]:
    """The param groups of the newest checkpoint's optimizer state (what the trainer built)."""
    newest = max((run / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime)
    return torch.load(newest / "optimizer.pt", weights_only=True)["param_groups"]


# ---------------------------------------------------------------------------- betas and eps


def test_recipes_take_adams_betas_and_eps_from_their_papers_code(tmp_path):
    """le2023 = run_clip.py's TrainingArguments defaults; kim2023 (no code published) = plain
    Adam's own defaults; open_clip_train's ViT values are one flag each away."""
    from transformers import TrainingArguments

    hf = TrainingArguments(output_dir=str(tmp_path))
    le = _parse("--recipe", "le2023").optim
    assert (le.beta1, le.beta2, le.eps) == (hf.adam_beta1, hf.adam_beta2, hf.adam_epsilon)
    adam = inspect.signature(torch.optim.Adam).parameters
    kim = _parse("--recipe", "kim2023").optim
    assert ((kim.beta1, kim.beta2), kim.eps) == (adam["betas"].default, adam["eps"].default)
    o = _parse("--recipe", "le2023", "--beta2", "0.98", "--eps", "1e-6").optim
    assert (o.beta1, o.beta2, o.eps, o.lr) == (0.9, 0.98, 1e-6, 5e-7)


def test_betas_and_eps_reach_the_optimizer(tmp_path, tiny_models_dir):
    real = real_set(tmp_path / "real", 8)
    out = tmp_path / "run"
    assert (
        train_main(
            tiny_args(
                real,
                out,
                tiny_models_dir,
                "--batch-size",
                "4",
                "--max-steps",
                "1",
                "--save-every",
                "1",
                "--beta1",
                "0.8",
                "--beta2",
                "0.98",
                "--eps",
                "1e-6",
            )
        )
        == 0
    )
    groups = optimizer_groups(out)
    assert [(tuple(g["betas"]), g["eps"]) for g in groups] == [((0.8, 0.98), 1e-6)] * 2
    assert json.loads((out / "run.json").read_text())["config"]["optim"]["beta2"] == 0.98


def test_bad_betas_are_one_line(tmp_path, capsys):
    assert cli_main(["train", "--real", str(tmp_path), "--output", str(tmp_path / "run"), "--beta2", "1.5"]) == 2
    assert "--beta2 1.5" in error_line(capsys)


# ---------------------------------------------------------------- open_clip's 1-D no-decay rule


def open_clip_train_excludes(name: str, p: torch.Tensor) -> bool:
    """open_clip_train/main.py's `exclude` (open_clip 3.3.0), on the name inside the model."""
    return p.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name


def test_open_clip_backend_keeps_1d_parameters_out_of_weight_decay(tmp_path, tiny_models_dir):
    from builders.models.profiles import tiny_profile
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend

    model = load_backend(parse_clip_id(tiny_profile(tiny_models_dir).open_clip, "open_clip")).module.model
    excluded = {n for n, p in model.named_parameters() if open_clip_train_excludes(n, p)}
    assert "visual.class_embedding" in excluded  # 1-D, decayed by the rule without ndim
    real = real_set(tmp_path / "real", 8)
    out = tmp_path / "run"
    assert (
        train_main(
            tiny_args(
                real,
                out,
                tiny_models_dir,
                "--backend",
                "open_clip",
                "--batch-size",
                "4",
                "--max-steps",
                "1",
                "--save-every",
                "1",
                "--weight-decay",
                "0.1",
            )
        )
        == 0
    )
    decay, no_decay = optimizer_groups(out)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    n_params = len(list(model.parameters()))
    assert (len(decay["params"]), len(no_decay["params"])) == (n_params - len(excluded), len(excluded))


# ------------------------------------------------------------------------------- SigLIP's loss


def tiny_siglip(tiny_models_dir, out: Path) -> str:
    """The tiny open_clip CLIP with SigLIP's logit bias and scale (open_clip's SigLIP configs:
    init_logit_bias -10, init_logit_scale ln 10), as a local-dir model."""
    import open_clip
    from safetensors.torch import save_file

    from builders.models.profiles import tiny_profile

    src = Path(tiny_profile(tiny_models_dir).open_clip.removeprefix("local-dir:"))
    cfg = json.loads((src / "open_clip_config.json").read_text())
    cfg["model_cfg"].update(init_logit_bias=-10.0, init_logit_scale=math.log(10))
    out.mkdir(parents=True)
    (out / "open_clip_config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    save_file(open_clip.CLIP(**cfg["model_cfg"]).state_dict(), str(out / "open_clip_model.safetensors"))
    return f"local-dir:{out}"


def test_siglip_loss_is_open_clips_and_negatives_are_extra_negative_cells():
    from open_clip.loss import SigLipLoss

    from training.losses import siglip_loss

    g = torch.Generator().manual_seed(0)
    img, txt, neg = (
        torch.nn.functional.normalize(torch.randn(6, 5, generator=g, dtype=torch.float64), dim=-1) for _ in range(3)
    )
    scale, bias = torch.tensor(10.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    want = SigLipLoss()(img, txt, scale, bias)
    assert float(siglip_loss(img, txt, scale, bias)) == pytest.approx(float(want), rel=1e-12)
    mask = torch.tensor([True, False, True, True, False, True])
    extra = sum(
        math.log1p(math.exp(float(scale * img[i] @ neg[j] + bias)))  # -log sigmoid(-x)
        for i in range(6)
        for j in range(6)
        if mask[j]
    )
    got = siglip_loss(img, txt, scale, bias, neg, mask)
    assert float(got) == pytest.approx(float(want) + extra / 6, rel=1e-12)


@pytest.mark.parametrize("negatives", [False, True])
def test_accumulated_siglip_gradients_equal_the_full_batch(negatives, tiny_models_dir, tmp_path):
    from open_clip.loss import SigLipLoss

    from training.accumulation import accumulate_gradients
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend
    from training.losses import siglip_loss

    backend = load_backend(parse_clip_id(tiny_siglip(tiny_models_dir, tmp_path / "siglip"), "open_clip"))
    module = backend.module
    pixels = torch.randn(8, 3, backend.image_size, backend.image_size, generator=torch.Generator().manual_seed(1))
    words = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]

    def batch(rows: range) -> dict:
        out = {
            "pixel_values": pixels[rows.start : rows.stop],
            "text": backend.tokenize([f"a {words[i]} cube" for i in rows]),
        }
        if negatives:
            out["negative_text"] = backend.tokenize([f"a {words[(i + 3) % 8]} cube" for i in rows])
            out["negative_mask"] = torch.tensor([i % 3 != 0 for i in rows])
        return out

    def grads() -> dict:
        out = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
        module.zero_grad(set_to_none=True)
        return out

    full = batch(range(8))
    img, txt, neg, scale, bias = module(
        pixel_values=full["pixel_values"], text=full["text"], negative_text=full.get("negative_text"), with_bias=True
    )
    loss = (
        siglip_loss(img, txt, scale, bias, neg, full.get("negative_mask"))
        if negatives
        else SigLipLoss()(img, txt, scale, bias)
    )
    loss.backward()
    want = grads()
    assert "model.logit_bias" in want
    got_loss = accumulate_gradients(
        module, [batch(range(b, b + 2)) for b in range(0, 8, 2)], OneProcessAccelerator(), "siglip"
    )
    got = grads()
    assert got_loss == pytest.approx(float(loss.detach()), abs=1e-5)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_a_siglip_model_trains_with_the_sigmoid_loss_and_refuses_the_softmax_one(tmp_path, tiny_models_dir, capsys):
    """The first step's logged loss is open_clip's SigLipLoss of the whole training set (one
    batch: its order does not matter), encoded by open_clip's own transform and tokenizer."""
    import open_clip
    from open_clip.loss import SigLipLoss

    model_id = tiny_siglip(tiny_models_dir, tmp_path / "siglip")
    real = real_set(tmp_path / "real", 8)
    out = tmp_path / "run"

    def args(out: Path, *extra: str) -> list[str]:
        return tiny_args(
            real,
            out,
            tiny_models_dir,
            "--backend",
            "open_clip",
            "--model",
            model_id,
            "--batch-size",
            "8",
            "--max-steps",
            "1",
            *extra,
        )

    assert train_main(args(out)) == 0
    assert json.loads((out / "run.json").read_text())["config"]["optim"]["loss"] == "siglip"
    model, _, preprocess = open_clip.create_model_and_transforms(model_id)
    tokenizer = open_clip.get_tokenizer(model_id)
    from datasets import load_dataset

    train = load_dataset(str(real), split="train")
    with torch.no_grad():
        images = model.encode_image(torch.stack([preprocess(im) for im in train["image"]]), normalize=True)
        texts = model.encode_text(tokenizer([c[0] for c in train["captions"]]), normalize=True)
        want = SigLipLoss()(images, texts, model.logit_scale.exp(), model.logit_bias)
    assert read_jsonl(out / "loss.jsonl")[0]["loss"] == pytest.approx(float(want), abs=1e-4)

    assert cli_main(["train", *args(tmp_path / "clip-loss", "--loss", "clip")]) == 2
    line = error_line(capsys)
    assert "--loss clip" in line and model_id in line and "--loss siglip" in line
    assert cli_main(["train", *tiny_args(real, tmp_path / "on-clip", tiny_models_dir), "--loss", "siglip"]) == 2
    assert "--loss siglip" in error_line(capsys)


# ----------------------------------------------------------------------- the last, short batch


def test_le2023_keeps_the_last_batch_and_the_default_drops_it(tmp_path, tiny_models_dir):
    """11 examples in batches of 4: run_clip.py's Trainer (`dataloader_drop_last=False`) makes
    ceil(11/4) = 3 steps an epoch, the last of 3 examples; open_clip_train (`drop_last=True`)
    floor(11/4) = 2. kim2023 drops it too."""
    from transformers import TrainingArguments

    assert TrainingArguments(output_dir=str(tmp_path)).dataloader_drop_last is False
    assert _parse("--recipe", "le2023").optim.last_batch == "keep"
    assert _parse("--recipe", "kim2023").optim.last_batch == _parse().optim.last_batch == "drop"
    real = real_set(tmp_path / "real", 11)
    for name, extra, steps in (
        ("keep", ["--recipe", "le2023", "--real-val-split", ""], 3),
        ("drop", [], 2),
        ("kim", ["--recipe", "kim2023"], 2),
    ):
        out = tmp_path / name
        assert (
            train_main(
                tiny_args(real, out, tiny_models_dir, *extra, "--batch-size", "4", "--epochs", "1", "--lr", "1e-4")
            )
            == 0
        ), name
        run = json.loads((out / "run.json").read_text())
        assert (run["steps_per_epoch"], run["steps"]) == (steps, steps), name
        assert [r["step"] for r in read_jsonl(out / "loss.jsonl")] == list(range(1, steps + 1)), name


def test_kept_last_batch_is_split_over_processes_in_whole_units():
    from training.data import PairBatchSampler

    groups = [[i] for i in range(11)]
    one = PairBatchSampler(groups, 4, keep_last=True, seed=3)
    assert [len(b) for b in one] == [4, 4, 3]
    parts = [list(PairBatchSampler(groups, 4, 2, rank, seed=3, keep_last=True)) for rank in (0, 1)]
    assert [len(b) for b in parts[0]] == [2, 2, 1] and [len(b) for b in parts[1]] == [2, 2, 2]
    assert [a + b for a, b in zip(*parts, strict=True)] == list(one)
    # A remainder smaller than the process count would leave a process without rows: dropped.
    assert len(PairBatchSampler([[i] for i in range(9)], 4, 2, 0, keep_last=True)) == 2


@pytest.mark.accelerate
def test_kept_uneven_last_batch_over_two_processes_is_the_batch_of_one(tmp_path, tiny_models_dir):
    """The last batch of 3 rows splits 1 + 2 over 2 processes; its gathered loss is one process's."""
    real = real_set(tmp_path / "real", 11)

    def args(out: Path) -> list[str]:
        return tiny_args(
            real, out, tiny_models_dir, "--batch-size", "4", "--epochs", "1", "--last-batch", "keep", "--lr", "1e-3"
        )

    assert train_main(args(tmp_path / "one")) == 0
    proc = subprocess.run(
        accelerate_cmd(SCRIPT, *args(tmp_path / "two"), "--expect-processes", "2"),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = read_jsonl(tmp_path / "one" / "loss.jsonl"), read_jsonl(tmp_path / "two" / "loss.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------- augmentation


@pytest.mark.parametrize("kind", ["transformers", "open_clip"])
def test_augment_is_open_clips_train_transform(kind, tiny_models_dir):
    """Under the same torch seed, `--augment` (with an --aug-cfg) gives open_clip's own train
    transform's pixels (`open_clip.image_transform(is_train=True, aug_cfg=...)`), with the
    backend's mean and std; and two draws differ (it is random), unlike the evaluation's."""
    import io
    import random

    import open_clip
    from PIL import Image as PILImage

    from builders.models.profiles import tiny_profile
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend
    from training.augmentation import parse_aug_cfg
    from training.data import decode_image

    profile = tiny_profile(tiny_models_dir)
    backend = load_backend(parse_clip_id(profile.clip if kind == "transformers" else profile.open_clip, kind))
    aug = parse_aug_cfg(("scale=(0.5, 1.0)", "color_jitter=(0.4, 0.4, 0.4, 0.1)", "color_jitter_prob=0.8"))
    pixels = backend.train_pixels(aug)
    p = backend.pixels
    reference = open_clip.image_transform(
        backend.image_size,
        is_train=True,
        mean=p.mean,
        std=p.std,
        aug_cfg={"scale": (0.5, 1.0), "color_jitter": (0.4, 0.4, 0.4, 0.1), "color_jitter_prob": 0.8},
    )
    buf = io.BytesIO()
    PILImage.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    data = buf.getvalue()
    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed), random.seed(seed)  # the crop draws from torch, the jitter from random
        ours = pixels.per_batch(decode_image(data, pixels.per_image(), pixels.size)[None])[0]
        torch.manual_seed(seed), random.seed(seed)
        want = reference(PILImage.open(io.BytesIO(data)))
        torch.testing.assert_close(ours, want, atol=1e-5, rtol=0)
        draws.append(ours)
    assert (draws[0] - draws[1]).abs().max() > 0.1


def test_augment_trains_on_the_train_transform_and_bad_cfg_is_one_line(tmp_path, tiny_models_dir, capsys, monkeypatch):
    import training.trainer

    used = []
    make_loader = training.trainer.make_loader
    monkeypatch.setattr(
        training.trainer, "make_loader", lambda *a, **k: used.append(k.get("pixels")) or make_loader(*a, **k)
    )
    real = real_set(tmp_path / "real", 8)
    assert (
        train_main(
            tiny_args(
                real,
                tmp_path / "run",
                tiny_models_dir,
                "--batch-size",
                "4",
                "--max-steps",
                "1",
                "--augment",
                "--aug-cfg",
                "scale=(0.5, 1.0)",
            )
        )
        == 0
    )
    crop = used[0].steps[1]  # after transformers' RGB conversion
    assert type(crop).__name__ == "RandomResizedCrop" and crop.scale == (0.5, 1.0)
    assert (
        cli_main(
            ["train", *tiny_args(real, tmp_path / "bad", tiny_models_dir), "--augment", "--aug-cfg", "ratio=(0.5, 2)"]
        )
        == 2
    )
    assert "--aug-cfg 'ratio=(0.5, 2)'" in error_line(capsys)
    assert (
        cli_main(["train", *tiny_args(real, tmp_path / "bad2", tiny_models_dir), "--aug-cfg", "scale=(0.5, 1.0)"]) == 2
    )
    assert "--augment" in error_line(capsys)


@pytest.mark.parametrize(
    "items, named",
    [
        # 100,000 nested unary minuses: ast.literal_eval ran out of memory on them (#41).
        (("scale=" + "-" * 100_000 + "1",), "--aug-cfg 'scale=---"),
        # torchvision's ColorJitter: hue in [0, 0.5], the factors >= 0 (it raised after run.json).
        (("color_jitter=(0,0,0,5)", "color_jitter_prob=0.5"), "--aug-cfg color_jitter=(0, 0, 0, 5)"),
        (("color_jitter=(-1,0,0,0)", "color_jitter_prob=0.5"), "--aug-cfg color_jitter=(-1, 0, 0, 0)"),
        (("color_jitter=(1e999,0,0,0)", "color_jitter_prob=0.5"), "--aug-cfg color_jitter=(inf, 0, 0, 0)"),
    ],
)
def test_an_aug_cfg_out_of_its_grammar_or_ranges_is_one_line_writing_nothing(
    items, named, tmp_path, tiny_models_dir, capsys
):
    real = real_set(tmp_path / "real", 4)
    out = tmp_path / "run"
    argv = ["train", *tiny_args(real, out, tiny_models_dir, "--batch-size", "4", "--max-steps", "1")]
    assert cli_main([*argv, "--augment", "--aug-cfg", *items]) == 2
    line = error_line(capsys)
    assert named in line and len(line) < 400, line
    assert not (out / "run.json").exists()


def test_aug_cfg_values_read_as_open_clip_train_reads_them():
    """The grammar takes what open_clip_train's `ParseKwargs` (ast.literal_eval) gives these
    keys: numbers, tuples and lists of them, None."""
    import ast

    from training.augmentation import parse_aug_cfg

    items = ("scale=[0.5, 1]", "color_jitter=( 0.4,0.4 ,.4, 1e-1 )", "color_jitter_prob=1", "gray_scale_prob=0.2")
    want = {k: ast.literal_eval(v) for k, v in (i.split("=", 1) for i in items)}
    got = parse_aug_cfg(items)
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in got.items()} == {
        k: list(v) if isinstance(v, tuple) else v for k, v in want.items()
    }
    assert parse_aug_cfg(("color_jitter=None", "color_jitter_prob=0")) == {
        "color_jitter": None,
        "color_jitter_prob": 0,
    }


# ------------------------------------------------------------------ metrics on the trackers


def test_evaluation_metrics_reach_tensorboard(tmp_path, tiny_models_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    real = write_color_set(tmp_path / "real", {"train": 1, "val": 1, "test": 1})
    out = tmp_path / "run"
    args = tiny_args(
        real,
        out,
        tiny_models_dir,
        "--batch-size",
        "8",
        "--max-steps",
        "2",
        "--eval-every",
        "1",
        "--real-val-split",
        "val",
    )
    args[args.index("--report-to") + 1] = "tensorboard"
    assert train_main(args) == 0
    events = sorted((out / "logs").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    evals = read_jsonl(out / "metrics.jsonl")
    for row in evals:
        prefix = "final" if row["final"] else "eval"
        for name in ("val_loss", "zeroshot_retrieval/text_retrieval_recall@1"):
            logged = {e.step: e.value for e in acc.Scalars(f"{prefix}/{name}")}
            assert logged[row["step"]] == pytest.approx(row[name], rel=1e-6), (prefix, name)
    assert [r["step"] for r in evals if not r["final"]] == [1, 2]


@pytest.mark.parametrize("flag", ["--seed", "--data-seed"])
def test_a_negative_seed_is_one_line_before_anything_is_written(flag, tmp_path, tiny_models_dir, capsys):
    """numpy's default_rng takes no negative seed: --seed -1 failed at the first batch, after
    run.json was written (#41)."""
    real = real_set(tmp_path / "real", 4)
    out = tmp_path / "run"
    argv = ["train", *tiny_args(real, out, tiny_models_dir, "--batch-size", "4", "--max-steps", "1", flag, "-1")]
    with pytest.raises(SystemExit) as stop:
        cli_main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"argument {flag}: must be at least 0 (got -1)" in err.splitlines()[-1], err
    assert not (out / "run.json").exists()
