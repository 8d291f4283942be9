"""The recipes as the papers ran them, checked against the reference trainers themselves: le2023
= transformers' TrainingArguments defaults (run_clip.py) where the paper is silent, its linear
schedule = `get_linear_schedule_with_warmup`, the no-decay group = biases, norm weights and
logit_scale by an independent name rule (and Hugging Face's own rule for the transformers
backend), and the logit scale clamped to ln 100 by the trainer after a step that pushes it above."""

from __future__ import annotations

import math
import re
import pytest
import torch

from training.finetune_clip import main as train_main

from helpers.training_helpers import weights, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


def _parse(*argv: str):
    from training.options import build_parser, config_from_args

    return config_from_args(build_parser().parse_args(["--real", "out/cc", "--output", "run", *argv]))


def test_le2023_recipe_is_the_papers_with_run_clip_trainer_defaults(tmp_path):
    """Le et al. 2023 §5: AdamW, lr 5e-7, weight decay 0.001, batch 128, best by validation
    loss; the rest is what run_clip.py's Trainer does by default."""
    from transformers import TrainingArguments

    hf = TrainingArguments(output_dir=str(tmp_path))
    o, r = _parse("--recipe", "le2023").optim, _parse("--recipe", "le2023").run
    assert (o.optimizer, o.lr, o.weight_decay, o.batch_size, r.best_by_val_loss) == ("adamw", 5e-7, 0.001, 128, True)
    assert o.epochs == hf.num_train_epochs == 3
    assert o.schedule == str(getattr(hf.lr_scheduler_type, "value", hf.lr_scheduler_type)) == "linear"
    assert o.max_grad_norm == hf.max_grad_norm == 1.0
    assert o.warmup_steps == hf.warmup_steps == 0
    # A flag still overrides one field.
    assert _parse("--recipe", "le2023", "--epochs", "1").optim.epochs == 1


@pytest.mark.parametrize("warmup", [0, 3])
def test_linear_schedule_is_transformers_linear_decay(warmup):
    from transformers import get_linear_schedule_with_warmup

    from training.trainer import lr_lambda

    total = 12
    cfg = _parse("--schedule", "linear", "--warmup-steps", str(warmup))
    ours = lr_lambda(cfg, steps_per_epoch=4, total_steps=total)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_linear_schedule_with_warmup(opt, warmup, total)
    for step in range(total):
        want = opt.param_groups[0]["lr"]
        # Warm-up: ours reaches the peak one step earlier ((step + 1) / warmup, as every schedule
        # of the trainer); the decay after it is transformers' exactly.
        if step >= warmup:
            assert ours(step) == pytest.approx(want, abs=1e-12), step
        opt.step()
        ref.step()
    assert ours(total - 1) == pytest.approx(1 / (total - warmup))


#: The independent rule: biases (nn.MultiheadAttention's in_proj_bias too), the weights of
#: LayerNorm modules as both libraries name them
#: (HF CLIP: layer_norm1/2, pre_layrnorm, post_layernorm, final_layer_norm; open_clip: ln_1,
#: ln_2, ln_pre, ln_post, ln_final) and the temperature.
NO_DECAY = re.compile(r"((^|\.)\w*bias$|(^|\.)logit_scale$|(^|\.)(ln_\w+|\w*lay\w*r?norm\w*)\.weight$)")


@pytest.mark.parametrize("kind", ["transformers", "open_clip"])
def test_no_decay_group_is_bias_norm_and_logit_scale(kind, tiny_models_dir):
    from builders.models.profiles import tiny_profile
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend
    from training.optimization import make_optimizer

    profile = tiny_profile(tiny_models_dir)
    module = load_backend(parse_clip_id(profile.clip if kind == "transformers" else profile.open_clip, kind)).module
    names = {id(p): n for n, p in module.named_parameters()}
    opt = make_optimizer(module, "adamw", 1e-3, 0.1)
    decay, no_decay = ({names[id(p)] for p in g["params"]} for g in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert no_decay == {n for n in names.values() if NO_DECAY.search(n)}
    assert decay == set(names.values()) - no_decay and any(n.endswith("logit_scale") for n in no_decay)
    assert all(p.ndim >= 2 for n, p in module.named_parameters() if n in decay and "embedding" not in n)
    if kind == "transformers":
        # Hugging Face's Trainer rule (what run_clip.py applies) + logit_scale, as open_clip.
        from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
        from transformers.trainer_pt_utils import get_parameter_names

        hf_decay = {"model." + n for n in get_parameter_names(module.model, ALL_LAYERNORM_LAYERS) if "bias" not in n}
        assert decay == hf_decay - {"model.logit_scale"}


def test_logit_scale_is_clamped_to_ln_100_after_a_step_pushing_it_above(tmp_path, tiny_models_dir, monkeypatch):
    """A loss of -exp(logit_scale) and Adam at lr 3 move logit_scale from ln(1/0.07) = 2.66 by
    +3 in one step, past ln 100 = 4.61; the trainer clamps it back to the bound."""
    import training.accumulation

    monkeypatch.setattr(training.accumulation, "clip_loss", lambda img, txt, scale, *rest: -scale.sum())
    real = write_color_set(tmp_path / "real", {"train": 1, "test": 1})
    out = tmp_path / "run"
    assert (
        train_main(
            [
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
                "--optimizer",
                "adam",
                "--lr",
                "3",
                "--batch-size",
                "4",
                "--max-steps",
                "1",
                "--num-workers",
                "0",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    from builders.models.profiles import tiny_profile
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend

    start = float(
        load_backend(
            parse_clip_id(tiny_profile(tiny_models_dir).clip, "transformers")
        ).module.model.logit_scale.detach()
    )
    assert start < math.log(100) < start + 3
    assert float(weights(out / "final")["logit_scale"]) == pytest.approx(math.log(100), abs=1e-6)
