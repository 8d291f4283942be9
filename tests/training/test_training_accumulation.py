"""`--grad-accum` keeps the contrastive batch whole and `--grad-checkpointing` changes no number:
with the tiny CLIPs of both backends in fp32, the loss and every parameter's gradient equal those
of the full batch computed in one plain forward + backward (within 1e-5); end to end, 2
processes x --grad-accum 2 train the loss curve of one plain batch."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from training.accumulation import accumulate_gradients
from builders.models.clip_ids import parse_clip_id
from training.backends import load_backend
from training.finetune_clip import main as train_main
from training.losses import clip_loss

from helpers.build_helpers import accelerate_cmd
from helpers.training_helpers import REPO_ROOT, SCRIPT, OneProcessAccelerator, read_jsonl, tiny_args, write_color_set

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

WORDS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]


def tiny_backend(kind: str, tiny_models_dir):
    from builders.models.profiles import tiny_profile

    profile = tiny_profile(tiny_models_dir)
    torch.manual_seed(0)
    return load_backend(parse_clip_id(profile.clip if kind == "transformers" else profile.open_clip, kind))


def make_batch(backend, rows: range, negatives: bool, pixels: torch.Tensor) -> dict:
    """Rows `rows` of one fixed batch; captions of varied length (micro-batches pad differently)."""
    captions = [f"a {WORDS[i]} cube" + " on a table" * (i % 3) for i in rows]
    batch = {"pixel_values": pixels[rows.start : rows.stop], "text": backend.tokenize(captions)}
    if negatives:  # every third row has no counterfactual caption
        negs = [None if i % 3 == 0 else f"a {WORDS[(i + 3) % 8]} cube" for i in rows]
        batch["negative_text"] = backend.tokenize([n or "" for n in negs])
        batch["negative_mask"] = torch.tensor([n is not None for n in negs])
    return batch


def grads(module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return out


def full_batch_reference(module, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    """The plain step: one forward of the whole batch, the loss, one backward."""
    img, txt, neg, scale = module(
        pixel_values=batch["pixel_values"], text=batch["text"], negative_text=batch.get("negative_text")
    )
    loss = clip_loss(img, txt, scale, neg, batch.get("negative_mask"))
    loss.backward()
    return float(loss.detach()), grads(module)


def assert_same(got: tuple[float, dict], want: tuple[float, dict]) -> None:
    assert got[0] == pytest.approx(want[0], abs=1e-5)
    assert got[1].keys() == want[1].keys() and want[1]
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("kind", ["transformers", "open_clip"])
@pytest.mark.parametrize("negatives", [False, True])
def test_accumulated_loss_and_gradients_equal_the_full_batch(kind, negatives, tiny_models_dir):
    backend = tiny_backend(kind, tiny_models_dir)
    module = backend.module
    pixels = torch.randn(8, 3, backend.image_size, backend.image_size, generator=torch.Generator().manual_seed(1))
    want = full_batch_reference(module, make_batch(backend, range(8), negatives, pixels))
    micro = [make_batch(backend, range(b, b + 2), negatives, pixels) for b in range(0, 8, 2)]
    got = accumulate_gradients(module, micro, OneProcessAccelerator()), grads(module)
    assert_same(got, want)
    # The old per-micro-batch mean (each micro-batch its own negatives) is another number.
    per_micro = sum(full_batch_reference(module, b)[0] for b in micro) / len(micro)
    assert abs(per_micro - want[0]) > 1e-3


@pytest.mark.parametrize("kind", ["transformers", "open_clip"])
def test_grad_checkpointing_gives_the_same_loss_and_gradients(kind, tiny_models_dir):
    backend = tiny_backend(kind, tiny_models_dir)
    pixels = torch.randn(6, 3, backend.image_size, backend.image_size, generator=torch.Generator().manual_seed(2))
    batch = make_batch(backend, range(6), False, pixels)
    want = full_batch_reference(backend.module, batch)
    backend.enable_grad_checkpointing()
    model = backend.module.model
    if kind == "transformers":
        assert model.is_activation_checkpointing
    else:
        assert model.visual.transformer.grad_checkpointing and model.transformer.grad_checkpointing
    assert_same(full_batch_reference(backend.module, batch), want)
    # With accumulation too (the memory-saving pair a small GPU uses).
    micro = [make_batch(backend, range(b, b + 3), False, pixels) for b in (0, 3)]
    assert_same((accumulate_gradients(backend.module, micro, OneProcessAccelerator()), grads(backend.module)), want)


@pytest.mark.accelerate
def test_grad_accum_over_two_processes_is_the_batch_of_one(tmp_path, tiny_models_dir):
    """Batch 8 x --grad-accum 2 on 2 processes, the same on 1, and one plain batch of 16 are one
    loss curve: the sampler's batch of 16 is its two consecutive batches of 8, and the loss is
    that of the gathered, accumulated whole."""
    data = write_color_set(tmp_path / "colors", {"train": 4, "val": 1, "test": 1})

    def args(out, batch: str, accum: str) -> list[str]:
        extra = ["--lr", "1e-3", "--batch-size", batch, "--grad-accum", accum, "--max-steps", "3"]
        return tiny_args(data, tiny_models_dir, out, *extra, "--hard-negatives", "pairs", "--report-to", "none")

    assert train_main(args(tmp_path / "plain", "16", "1")) == 0
    assert train_main(args(tmp_path / "accum", "8", "2")) == 0
    proc = subprocess.run(
        accelerate_cmd(SCRIPT, *args(tmp_path / "two", "8", "2"), "--expect-processes", "2"),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain, accum, two = (read_jsonl(tmp_path / name / "loss.jsonl") for name in ("plain", "accum", "two"))
    assert [r["step"] for r in plain] == [r["step"] for r in accum] == [r["step"] for r in two] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in accum], [r["loss"] for r in plain], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in plain], rtol=1e-4, atol=1e-5)
