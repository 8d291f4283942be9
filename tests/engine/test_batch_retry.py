"""Memory safety (issue #23, item 4): a batch that runs out of memory is halved and retried.

Out-of-memory is injected (a stand-in batch function or model raises `torch.cuda.OutOfMemoryError`
above k items); the run must give what an un-failing run gives, with every item in the output
exactly once, the final batch size logged once at INFO, and one clear error below one item. The
caption and P2P image stages are checked with the tiny models in test_counterfactual_captions.py
and test_prompt_to_prompt.py.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from builders.engine.batching import BatchTooLargeError, ShrinkingBatches, is_out_of_memory
from builders.engine.errors import UserFacingError

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity)"


def oom_above(k: int, fn, attempts: list):
    """`fn` that records every attempted batch and runs out of memory above k items."""

    def wrapped(batch):
        attempts.append(list(batch))
        if len(batch) > k:
            raise torch.cuda.OutOfMemoryError(OOM)
        return fn(batch)

    return wrapped


def infos(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]


@pytest.mark.parametrize("k", [1, 3, 8, 100])
@pytest.mark.slow
def test_a_batch_that_does_not_fit_is_halved_and_the_same_items_retried(k, caplog):
    items = list(range(23))
    done: list[int] = []
    attempts: list[list[int]] = []

    def square(batch):
        done.extend(batch)
        return [x * x for x in batch]

    batches = ShrinkingBatches("toy stage", 16)
    with caplog.at_level(logging.INFO, logger="builders.engine.batching"):
        out = batches.map(items, oom_above(k, square, attempts))
    assert out == [x * x for x in items]
    assert done == items  # the successful calls saw every item once, in order
    want = 16
    while want > k:  # halving from 16: the first size not above k
        want //= 2
    assert batches.size == want
    assert all(len(a) <= 16 for a in attempts) and max(len(a) for a in attempts if len(a) <= k) == want
    messages = infos(caplog)
    assert len(messages) == 1 and "toy stage" in messages[0] and f"batch size {want}" in messages[0]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (16 // want).bit_length() - 1  # one per halving


def test_the_size_that_fit_is_kept_for_later_calls_and_logged_once(caplog):
    attempts: list[list[int]] = []
    batches = ShrinkingBatches("toy stage", 8)
    fn = oom_above(2, lambda b: list(b), attempts)
    with caplog.at_level(logging.INFO, logger="builders.engine.batching"):
        assert batches.map(list(range(8)), fn) == list(range(8))
        first = len(attempts)
        assert batches.map(list(range(8, 14)), fn) == list(range(8, 14))
    # The second call never tries a size that ran out of memory: 3 batches of 2, no failure.
    assert attempts[first:] == [[8, 9], [10, 11], [12, 13]]
    assert len(infos(caplog)) == 1


def test_accelerates_out_of_memory_messages_are_retried_other_errors_are_not():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("anything"))
    assert is_out_of_memory(RuntimeError(OOM))
    assert is_out_of_memory(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: 9 GB"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory."))

    calls = []

    def fails(batch):
        calls.append(batch)
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        ShrinkingBatches("toy stage", 4).map([1, 2, 3, 4], fails)
    assert len(calls) == 1  # a real bug is not retried at smaller sizes

    def plain_oom(batch):
        if len(batch) > 1:
            raise RuntimeError(OOM)
        return list(batch)

    assert ShrinkingBatches("toy stage", 4).map([1, 2, 3], plain_oom) == [1, 2, 3]


def test_one_item_that_does_not_fit_is_one_clear_error_naming_the_stage():
    batches = ShrinkingBatches("image stage (P2P + CLIP filters)", 4, hint="try a smaller --image-size")
    with pytest.raises(BatchTooLargeError) as err:
        batches.map([1, 2, 3], oom_above(0, list, []))
    assert isinstance(err.value, UserFacingError)  # the CLI prints it as one line, exit 2
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("image stage (P2P + CLIP filters): out of memory with a batch of one")
    assert "--image-size" in message and "CUDA out of memory" in message
    # The default hint names the precision option.
    with pytest.raises(BatchTooLargeError, match="--dtype fp16"):
        ShrinkingBatches("toy", 1).call(lambda x: oom_above(0, list, [])([x]), 7)


def test_planned_batches_run_as_planned_until_memory_runs_out_and_a_caller_may_stop_early():
    planned = [[1, 2, 3, 4, 5], [6], [7, 8, 9, 10, 11, 12]]  # some larger than the size: groups
    attempts: list[list[int]] = []
    run = ShrinkingBatches("toy stage", 4).run(planned, oom_above(5, sum, attempts))
    assert next(run) == ([1, 2, 3, 4, 5], 15)  # fits: not cut although larger than 4
    assert next(run) == ([6], 6)
    # 6 items run out of memory: the size halves to 2 and the same items are cut by `split`.
    assert list(run) == [([7, 8], 15), ([9, 10], 19), ([11, 12], 23)]
    assert attempts == [[1, 2, 3, 4, 5], [6], [7, 8, 9, 10, 11, 12], [7, 8], [9, 10], [11, 12]]
    lazy: list[list[int]] = []
    stream = ShrinkingBatches("toy stage", 2).run([[1], [2], [3]], oom_above(9, sum, lazy))
    assert next(stream) == ([1], 1) and lazy == [[1]]  # nothing beyond what was consumed ran


class Features(torch.nn.Module):
    """A DualEncoder stand-in whose features depend on each row only, running out of memory
    above `k` rows."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.k, self.rows = k, []

    def forward(self, pixel_values=None, text=None):
        x = pixel_values.flatten(1)[:, :2] if pixel_values is not None else text["input_ids"][:, :2].float()
        if len(x) > self.k:
            raise torch.cuda.OutOfMemoryError(OOM)
        self.rows.append(len(x))
        feats = torch.nn.functional.normalize(x + 1, dim=-1)
        return (feats, None, None, None) if pixel_values is not None else (None, feats, None, None)


@pytest.mark.slow
def test_evaluation_encodes_give_the_same_embeddings_after_running_out_of_memory(monkeypatch, caplog):
    from training import evaluation

    pixels = torch.arange(7 * 12, dtype=torch.float32).reshape(7, 3, 2, 2)
    monkeypatch.setattr(
        evaluation,
        "make_loader",
        lambda examples, batches, backend, workers: [{"pixel_values": pixels[b]} for b in batches],
    )
    backend = SimpleNamespace(tokenize=lambda texts: {"input_ids": torch.tensor([[len(t), ord(t[0])] for t in texts])})
    texts = ["a", "bb", "ccc", "dddd", "eeeee", "f", "gg"]
    evaluation._shrinking.cache_clear()
    want_images = evaluation.encode_images(Features(100), backend, list(range(7)), 4, 0)
    want_texts = evaluation.encode_texts(Features(100), backend, texts, 4)
    evaluation._shrinking.cache_clear()
    model = Features(1)
    with caplog.at_level(logging.INFO, logger="builders.engine.batching"):
        images = evaluation.encode_images(model, backend, list(range(7)), 4, 0)
        text_emb = evaluation.encode_texts(model, backend, texts, 4)
    evaluation._shrinking.cache_clear()
    assert np.array_equal(images, want_images) and np.array_equal(text_emb, want_texts)
    assert images.shape == (7, 2) and model.rows == [1] * 14  # each row encoded once
    assert sum("evaluation image encode: batch size 1" in m for m in infos(caplog)) == 1


def test_mitl_embeddings_are_the_same_after_running_out_of_memory(monkeypatch, tmp_path):
    from builders.eccv_positives.mitl import embeddings
    from builders.models import clip

    class Scorer:
        """Embeddings per item; out of memory above 2 items."""

        def images(self, images):
            if len(images) > 2:
                raise torch.cuda.OutOfMemoryError(OOM)
            return torch.tensor([[float(n), 1.0] for n in images])

        def texts(self, texts):
            if len(texts) > 2:
                raise torch.cuda.OutOfMemoryError(OOM)
            return torch.tensor([[float(len(t)), 2.0] for t in texts])

    monkeypatch.setattr(clip, "load_scorer", lambda model_id, device="cpu", backend=None, dtype=None: Scorer())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gallery = SimpleNamespace(
        image_ids=list(range(5)),
        captions=["a", "bb", "a", "ccc", "dddd"],
        digest=lambda: "g",
        files_fingerprint=lambda: "f",
        open_image=lambda n: n,
    )
    images, captions = embeddings.gallery_embeddings("stand-in/clip", gallery, tmp_path / "cache", batch_size=8)
    assert images.tolist() == [[float(n), 1.0] for n in range(5)]
    assert captions.tolist() == [[float(len(t)), 2.0] for t in gallery.captions]


def test_decorrelation_fill_out_of_memory_is_one_clear_error(monkeypatch):
    from PIL import Image

    from builders.decorrelation.config import FillConfig
    from builders.decorrelation.fill import ImageFiller

    filler = ImageFiller(FillConfig(method="inpaint", model="stand-in/sd-inpaint"))

    def inpaint(image, mask, seed):
        raise torch.cuda.OutOfMemoryError(OOM)

    monkeypatch.setattr(filler, "_inpaint", inpaint)
    mask = np.zeros((4, 4), bool)
    mask[1:3, 1:3] = True
    with pytest.raises(BatchTooLargeError, match=r"^decorrelation fill \(inpainting\): out of memory.*--image-size"):
        filler.fill(Image.new("RGB", (4, 4), "white"), mask, 0)
