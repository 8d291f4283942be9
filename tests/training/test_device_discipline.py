"""Inputs follow the model to its device (issue #23, item 1), checked without a GPU.

The loaders yield CPU tensors. The trainer's run device (`accelerator.device`), evaluation's (the
weights' device) and the MITL embeddings' (`worker_device()`, the process's GPU when CUDA is
present) are made something else here — the `meta` device, or CUDA reported as present — and a
stand-in model records the device of every tensor reaching its forward.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from training import evaluation
from training.eval_data import EvalData
from training.trainer import _accumulate_gradients

from helpers.training_helpers import OneProcessAccelerator

RUN_DEVICE = torch.device("meta")


class Reached(Exception):
    """The forward was reached (the trainer test stops there: no loss is taken on `meta`)."""


class Recorder(nn.Module):
    """A DualEncoder stand-in whose weights sit on the run device. It records the device of every
    tensor it is given and returns CPU features (or raises `Reached` with `stop`)."""

    def __init__(self, stop: bool = False) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1, device=RUN_DEVICE))
        self.stop = stop
        self.seen: list[tuple[str, torch.device]] = []

    def forward(self, pixel_values=None, text=None, negative_text=None):
        inputs = {
            "pixel_values": pixel_values,
            **{f"text.{k}": v for k, v in (text or {}).items()},
            **{f"negative_text.{k}": v for k, v in (negative_text or {}).items()},
        }
        self.seen += [(name, t.device) for name, t in inputs.items() if t is not None]
        if self.stop:
            raise Reached
        rows = len(pixel_values) if pixel_values is not None else len(text["input_ids"])
        feats = nn.functional.normalize(torch.ones(rows, 2), dim=-1)
        return (
            feats if pixel_values is not None else None,
            feats if text is not None else None,
            None,
            torch.tensor(1.0),
        )


def cpu_batch(rows: int = 2, negatives: bool = False) -> dict:
    """What training/data.py's loader yields: CPU tensors (normalised pixels, token dicts)."""
    tokens = {
        "input_ids": torch.ones(rows, 3, dtype=torch.long),
        "attention_mask": torch.ones(rows, 3, dtype=torch.long),
    }
    batch = {"pixel_values": torch.zeros(rows, 3, 4, 4), "text": tokens}
    if negatives:
        batch["negative_text"] = {k: v.clone() for k, v in tokens.items()}
        batch["negative_mask"] = torch.ones(rows, dtype=torch.bool)
    return batch


def assert_all_on(seen, device) -> None:
    assert seen, "the model's forward was never reached"
    assert [(name, d) for name, d in seen if d != device] == [], f"inputs not on {device}"


@pytest.mark.parametrize("negatives", [False, True])
def test_a_training_step_feeds_the_batch_on_the_accelerators_device(negatives):
    model = Recorder(stop=True)
    session = SimpleNamespace(
        accelerator=OneProcessAccelerator(RUN_DEVICE),
        model=model,
        backend=SimpleNamespace(dual_encoder=True),
        cfg=SimpleNamespace(optim=SimpleNamespace(grad_accum=1, loss="clip")),
    )
    with pytest.raises(Reached):
        _accumulate_gradients(session, iter([cpu_batch(negatives=negatives)]))
    assert_all_on(model.seen, RUN_DEVICE)
    assert {name for name, _ in model.seen} >= {"pixel_values", "text.input_ids"}


def test_evaluation_encodes_on_the_models_device(monkeypatch):
    monkeypatch.setattr(
        evaluation, "make_loader", lambda examples, batches, backend, workers: [cpu_batch(len(b)) for b in batches]
    )
    backend = SimpleNamespace(tokenize=lambda texts: cpu_batch(len(texts))["text"], dual_encoder=True)
    model = Recorder()
    images = evaluation.encode_images(model, backend, [0, 1, 2], batch_size=2, workers=0)
    texts = evaluation.encode_texts(model, backend, ["a", "b", "c"], batch_size=2)
    loss = evaluation.validation_loss(model, backend, [0, 1, 2, 3], batch_size=2, workers=0)
    assert_all_on(model.seen, RUN_DEVICE)
    assert isinstance(images, np.ndarray) and images.shape == texts.shape == (3, 2)
    assert np.isfinite(loss)


def test_mitl_embeddings_load_the_annotator_on_the_process_device(monkeypatch, tmp_path):
    from builders.eccv_positives.mitl import embeddings
    from builders.models import clip

    loaded_on = []

    class Scorer:
        def images(self, images):
            return torch.ones(len(images), 2)

        def texts(self, texts):
            return torch.ones(len(texts), 2)

    def load_scorer(model_id, device="cpu", backend=None, dtype="fp32"):
        loaded_on.append((str(device), dtype))
        return Scorer()

    monkeypatch.setattr(clip, "load_scorer", load_scorer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the process has a GPU
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gallery = SimpleNamespace(
        image_ids=[1, 2, 3],
        captions=["a", "b", "a"],
        digest=lambda: "g",
        files_fingerprint=lambda: "f",
        open_image=lambda n: n,
    )
    images, captions = embeddings.gallery_embeddings("stand-in/clip", gallery, tmp_path / "cache")
    assert loaded_on == [("cuda:1", "fp16")]  # --dtype auto on a GPU
    assert images.shape == captions.shape == (3, 2) and images.dtype == np.float32


def test_eval_only_evaluates_the_model_on_the_accelerators_device(monkeypatch, tmp_path):
    from training import trainer
    from training.config import RunConfig, TrainConfig
    from training.run_root import RunRoot

    evaluated_on = []
    monkeypatch.setattr(
        trainer,
        "eval_only_sets",
        lambda data: SimpleNamespace(heldout_cf=[], train=SimpleNamespace(tables=[]), validation=None, records=[]),
    )
    monkeypatch.setattr(trainer, "load_eval_data", lambda *args: EvalData())
    monkeypatch.setattr(
        trainer, "evaluate_model", lambda module, *args: evaluated_on.append(next(module.parameters()).device) or {}
    )
    monkeypatch.setattr(trainer, "published_record", lambda record, cfg, output: record)
    monkeypatch.setattr(trainer, "write_results", lambda *args: None)
    accelerator = SimpleNamespace(
        device=RUN_DEVICE, is_main_process=True, wait_for_everyone=lambda: None, log=lambda metrics, step: None
    )
    backend = SimpleNamespace(module=nn.Linear(2, 2))  # loaded on the CPU, as load_backend does
    with RunRoot(tmp_path) as root:
        trainer.evaluate_only(TrainConfig(run=RunConfig(bootstrap=0)), accelerator, backend, {}, root)
    assert evaluated_on == [RUN_DEVICE]
