"""Prompt-to-Prompt's word-swap token alignment (Hertz et al. 2022; builders/counterfactuals/METHOD.md
§2, "Attention injection"): which of the original caption's cross-attention maps each token of
the counterfactual caption takes under `--inject cross|both`.

The reference is google/prompt-to-prompt's `seq_aligner.get_replacement_mapper_`, reimplemented
here from its published logic: walking both token sequences from the start, the tokens before
the swapped word map one to one; the swapped word's tokens map one to one when both words have
as many tokens, else every new token takes 1/(new token count) of every old token's map; once
the swapped word is passed, token j takes token j's map (`mapper[j, j] = 1`): the following
tokens keep their positions, they are not shifted by the difference in token counts.
"""

from __future__ import annotations

from typing import Sequence

import torch


def replacement_mapper(source_ids: Sequence[int], target_ids: Sequence[int], length: int) -> torch.Tensor:
    """Prompt-to-Prompt's word-swap mapper `M` (length x length, `get_replacement_mapper_`): the
    counterfactual's map of token n is `sum_w M[w, n] * map_of_source_token_w`.

    The swapped word is what lies between the unpadded ids' common prefix and common suffix (for a
    one-word swap, P2P's word alignment, unless the two words share a leading or trailing
    sub-token, which then maps to itself). As in the reference's loop, the columns after the
    swapped word are the identity until either sequence's walk reaches `length`: where the old word
    has more tokens, the last columns get no source, and such a column keeps the counterfactual's
    own map (`P2PAttnProcessor`)."""
    ns, nt = len(source_ids), len(target_ids)
    a = 0
    while a < min(ns, nt) and source_ids[a] == target_ids[a]:
        a += 1
    b = 0
    while b < min(ns, nt) - a and source_ids[-1 - b] == target_ids[-1 - b]:
        b += 1
    mapper = torch.zeros(length, length)
    for k in range(min(a, length)):
        mapper[k, k] = 1.0
    old, new = range(a, min(ns - b, length)), range(a, min(nt - b, length))
    if len(old) == len(new):
        for w, n in zip(old, new, strict=True):
            mapper[w, n] = 1.0
    elif len(old) and len(new):
        mapper[old.start : old.stop, new.start : new.stop] = 1.0 / len(new)
    # The reference's walk after the swapped word: source index i and target index j advance
    # together from the word's ends, writing mapper[j, j], until one reaches `length`.
    i, j = ns - b, nt - b
    for n in range(j, j + max(0, length - max(i, j))):
        mapper[n, n] = 1.0
    return mapper


def word_swap_mapper(tokenizer, caption_0: str, caption_1: str, length: int, inject: str) -> torch.Tensor | None:
    """`replacement_mapper` of the captions as `tokenizer` reads them (None unless `inject` swaps
    cross-attention maps)."""
    if inject not in ("cross", "both"):
        return None
    ids = [
        tokenizer(t, truncation=True, max_length=tokenizer.model_max_length).input_ids for t in (caption_0, caption_1)
    ]
    return replacement_mapper(ids[0], ids[1], length)
