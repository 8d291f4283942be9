"""R@K with duplicate captions and images (#44): COCO repeats short captions, and a matrix
product puts equal captions' scores a few ulp apart, which decided 65 of 1,000 image -> text hits
on the fixture. Equal captions score equal by construction, and equal scores rank by the
gallery's id (docs/report.md): checked against a brute-force ranking under that rule, and
unchanged when the captions and images are permuted."""

from __future__ import annotations

import numpy as np
import pytest

from training.eval_data import EvalData
from training.evaluation import retrieval_metrics

K = (1, 2, 5)


def _planted():
    """8 images (two of them the same picture: equal embeddings) with 3 captions each, drawn
    from 5 sentences; one copy of a sentence carries encoder noise (a batch-dependent ulp)."""
    rng = np.random.default_rng(0)
    image_ids = np.arange(100, 108)
    images = rng.normal(size=(8, 6)).astype(np.float32)
    images[5] = images[4]
    sentences = rng.normal(size=(5, 6)).astype(np.float32)
    owner = np.repeat(image_ids, 3)
    which = rng.integers(0, 5, size=len(owner))
    texts = sentences[which].copy()
    texts[7] = np.nextafter(texts[7], np.float32(np.inf))
    return dict(
        images=images,
        image_ids=image_ids,
        texts=texts,
        captions=[f"sentence {w}" for w in which],
        caption_ids=rng.permutation(1000)[: len(owner)],
        owner=owner,
        sentences=sentences,
        which=which,
    )


def _brute_force(p) -> dict[str, float]:
    """R@K by the documented rule: a caption scores as its sentence, in float64; equal scores
    rank by id (caption id image -> text, image id text -> image)."""
    scores = p["images"].astype(np.float64) @ p["sentences"][p["which"]].astype(np.float64).T
    out = {}
    for k in K:
        i2t = []
        for i, image in enumerate(p["image_ids"]):
            ranked = sorted(range(len(p["owner"])), key=lambda c: (-scores[i, c], p["caption_ids"][c]))
            i2t.append(any(p["owner"][c] == image for c in ranked[:k]))
        t2i = []
        for c, image in enumerate(p["owner"]):
            ranked = sorted(range(len(p["image_ids"])), key=lambda i: (-scores[i, c], p["image_ids"][i]))
            t2i.append(image in p["image_ids"][ranked[:k]])
        out[f"zeroshot_retrieval/text_retrieval_recall@{k}"], out[f"zeroshot_retrieval/image_retrieval_recall@{k}"] = (
            np.mean(i2t),
            np.mean(t2i),
        )
    return out


def _ours(p, images: np.ndarray, captions: np.ndarray) -> dict[str, float]:
    """Our R@K with the images in order `images` and the captions in order `captions`."""
    data = EvalData(
        image_ids=p["image_ids"][images],
        caption_ids=p["caption_ids"][captions],
        caption_image=p["owner"][captions],
        captions=[p["captions"][c] for c in captions],
    )
    emb = {"image": p["images"][images], "text": p["texts"][captions]}
    return retrieval_metrics(emb, data, K)


def test_recall_with_duplicate_captions_follows_the_tie_rule_in_any_order():
    p = _planted()
    expected = _brute_force(p)
    # The plant has ties that decide hits: breaking them the other way (ids descending) gives
    # another R@1.
    same = np.isclose(
        expected["zeroshot_retrieval/text_retrieval_recall@1"],
        _brute_force({**p, "caption_ids": -p["caption_ids"]})["zeroshot_retrieval/text_retrieval_recall@1"],
    )
    assert not same
    rng = np.random.default_rng(1)
    n_images, n_captions = len(p["image_ids"]), len(p["owner"])
    for _ in range(5):
        got = _ours(p, rng.permutation(n_images), rng.permutation(n_captions))
        assert got == pytest.approx(expected, abs=1e-12)


def test_equal_captions_get_bit_equal_scores():
    from training.ranked_scores import tied_scores

    p = _planted()
    full = tied_scores(p["images"], p["texts"], p["captions"])
    for a in range(len(p["owner"])):
        for b in range(len(p["owner"])):
            if p["captions"][a] == p["captions"][b]:
                assert np.array_equal(full[:, a], full[:, b])
    assert np.array_equal(full[4], full[5])  # the same picture twice
    # Distinct captions and images keep the plain product's scores, bit for bit (those that
    # equal clip_benchmark's on unique captions).
    images, texts = p["images"][:4], p["sentences"]
    assert np.array_equal(tied_scores(images, texts, [f"s{j}" for j in range(len(texts))]), images @ texts.T)


def test_each_distinct_caption_is_encoded_once_and_copied_to_its_repeats():
    """encode_texts: the encoder sees each distinct caption once, in order of first appearance
    (the stand-in's output depends on its batch's size, as real kernels' rounding can), and a
    repeat gets its first copy's row, bit-equal."""
    import torch

    from training.evaluation import encode_texts

    seen: list[str] = []

    class Backend:
        def tokenize(self, chunk):
            seen.extend(chunk)
            return {"text": torch.tensor([[len(t), sum(map(ord, t))] for t in chunk], dtype=torch.float32)}

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward(self, text):
            tokens = text["text"]
            return None, torch.nn.functional.normalize(tokens + 1e-3 * len(tokens), dim=1)

    captions = ["a dog", "a cat", "a dog", "two dogs", "a cat", "a dog"]
    emb = encode_texts(Encoder(), Backend(), captions, batch_size=4)
    assert seen == ["a dog", "a cat", "two dogs"]
    distinct = encode_texts(Encoder(), Backend(), ["a dog", "a cat", "two dogs"], batch_size=4)
    assert np.array_equal(emb, distinct[[0, 1, 0, 2, 1, 0]])
    assert np.array_equal(emb[0], emb[2]) and np.array_equal(emb[0], emb[5]) and np.array_equal(emb[1], emb[4])
