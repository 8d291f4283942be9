"""Prompt-to-Prompt as google/prompt-to-prompt does it (issue #52 item 4): the word-swap mapper
equals `seq_aligner.get_replacement_mapper_` when the swapped words split into different token
counts, and `--self-replace-fraction` (P2P's `self_replace_steps`) touches exactly the maps P2P's
`AttentionControlEdit.forward` replaces: self-attention of at most 16 x 16 positions, conditional
half.

The reference mapper below is a straight transcription of `get_replacement_mapper_`'s loop
(word indices from a tokenizer that splits each word into a known list of tokens), written here,
not derived from `builders.counterfactuals.word_swap`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor

from builders.counterfactuals.prompt_to_prompt import P2PAttnProcessor, P2PController, PairSpec
from builders.counterfactuals.word_swap import word_swap_mapper

#: Each word's tokens: `hotdog` is 2 tokens, `zebra` 3, the others 1. [bos] 0, [eos] 1.
VOCAB = {
    "a": [5],
    "cat": [7],
    "hotdog": [6, 8],
    "zebra": [12, 13, 14],
    "on": [10],
    "the": [11],
    "sofa": [9],
    "red": [15],
}


class WordTokenizer:
    """A tokenizer with `model_max_length` whose ids are [bos] + each word's tokens + [eos]."""

    model_max_length = 77

    def __call__(self, text: str, truncation: bool = True, max_length: int = 77):
        ids = [0] + [t for w in text.split(" ") for t in VOCAB[w]] + [1]

        class Out:
            input_ids = ids[:max_length]

        return Out()


def word_inds(text: str, word: int) -> list[int]:
    """P2P's `get_word_inds`: the token positions (after [bos]) of word number `word`."""
    words = text.split(" ")
    start = 1 + sum(len(VOCAB[w]) for w in words[:word])
    return list(range(start, start + len(VOCAB[words[word]])))


def p2p_replacement_mapper(x: str, y: str, max_len: int) -> np.ndarray:
    """google/prompt-to-prompt `seq_aligner.get_replacement_mapper_`, transcribed."""
    words_x, words_y = x.split(" "), y.split(" ")
    inds_replace = [i for i in range(len(words_y)) if words_y[i] != words_x[i]]
    inds_source = [word_inds(x, i) for i in inds_replace]
    inds_target = [word_inds(y, i) for i in inds_replace]
    mapper = np.zeros((max_len, max_len))
    i = j = 0
    cur_inds = 0
    while i < max_len and j < max_len:
        if cur_inds < len(inds_source) and inds_source[cur_inds][0] == i:
            inds_source_, inds_target_ = inds_source[cur_inds], inds_target[cur_inds]
            if len(inds_source_) == len(inds_target_):
                mapper[inds_source_, inds_target_] = 1
            else:
                ratio = 1 / len(inds_target_)
                for i_t in inds_target_:
                    mapper[inds_source_, i_t] = ratio
            cur_inds += 1
            i += len(inds_source_)
            j += len(inds_target_)
        elif cur_inds < len(inds_source):
            mapper[i, j] = 1
            i += 1
            j += 1
        else:
            mapper[j, j] = 1
            i += 1
            j += 1
    return mapper


@pytest.mark.parametrize(
    "x, y",
    [
        ("a cat on the sofa", "a hotdog on the sofa"),  # 1 token -> 2
        ("a hotdog on the sofa", "a cat on the sofa"),  # 2 -> 1
        ("a red cat on the sofa", "a red zebra on the sofa"),  # 1 -> 3
        ("a zebra on the sofa", "a hotdog on the sofa"),  # 3 -> 2
        ("a cat on the sofa", "a red on the sofa"),  # same count
    ],
)
@pytest.mark.parametrize("length", [77, 9, 7])
def test_the_word_swap_mapper_is_p2ps_get_replacement_mapper(x, y, length):
    got = word_swap_mapper(WordTokenizer(), x, y, length, "cross")
    # The reference returns `torch.from_numpy(mapper).float()`.
    np.testing.assert_array_equal(got.numpy(), p2p_replacement_mapper(x, y, length).astype(np.float32))


def test_the_tokens_after_a_longer_word_keep_their_places():
    """The case that tells P2P's mapper from a shifted alignment: `on` (position 4 in the new
    caption) takes position 4's map, not `on`'s map at position 3 of the old caption."""
    got = word_swap_mapper(WordTokenizer(), "a cat on the sofa", "a hotdog on the sofa", 77, "both")
    assert got[4, 4] == 1 and got[3, 4] == 0
    assert word_swap_mapper(WordTokenizer(), "a cat", "a hotdog", 77, "self") is None


def _rows_injected(ctrl: P2PController, positions: int) -> list[int]:
    """The rows of the guidance batch whose self-attention output a P2P processor changes, in a
    layer of `positions` query positions (the rows diffusers' own attention computes otherwise)."""
    torch.manual_seed(0)
    attn = Attention(query_dim=16, heads=2, dim_head=8).eval()
    hidden = torch.randn(4, positions, 16)  # [uncond o, c | cond o, c]
    with torch.no_grad():
        plain = AttnProcessor()(attn, hidden)
        got = P2PAttnProcessor(ctrl, is_cross=False)(attn, hidden)
    return [r for r in range(4) if not torch.allclose(got[r], plain[r], atol=1e-6)]


@pytest.mark.parametrize("inject", ["cross", "both"])
def test_the_self_fraction_touches_the_maps_of_p2ps_self_replace_steps(inject):
    """Cross fraction 0, self fraction 1, at step 0: P2P replaces the self maps of low-resolution
    layers (here: at most 6 positions) in the conditional half (row 3 from row 2) and no other;
    a 7-position layer is beyond them, so nothing changes there."""
    ctrl = P2PController([PairSpec(0, 0.0, 7.5, p_self=1.0)], 10, inject, torch.eye(4), low_res_tokens=6)
    assert _rows_injected(ctrl, 6) == [3]
    assert _rows_injected(ctrl, 7) == []


def test_under_both_the_other_self_maps_follow_the_cross_fraction():
    """Cross fraction 1, self fraction 0: `both`'s instruct-pix2pix-style self injection covers
    the maps P2P's self fraction does not govern (both halves of a high-resolution layer, the
    unconditional half of a low-resolution one); the conditional low-resolution maps follow the
    self fraction 0 and stay the counterfactual's own."""
    ctrl = P2PController([PairSpec(0, 1.0, 7.5, p_self=0.0)], 10, "both", torch.eye(4), low_res_tokens=6)
    assert _rows_injected(ctrl, 7) == [1, 3]
    assert _rows_injected(ctrl, 6) == [1]
    # One fraction for both (the paper's default): every self map, both halves, as before.
    one = P2PController([PairSpec(0, 0.5, 7.5)], 10, "both", torch.eye(4), low_res_tokens=6)
    assert _rows_injected(one, 6) == _rows_injected(one, 7) == [1, 3]
