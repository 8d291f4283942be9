"""Prompt-to-Prompt attention injection: the processors compute what the method says (checked
against explicit attention maps), injection pulls the pair together, the original image never
depends on p, and a candidate's images do not depend on its batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor

from builders.infra.models.loaders import load_sd
from builders.infra.models.profiles import resolve_profile
from builders.counterfactuals.prompt_to_prompt import (P2PAttnProcessor, P2PController, PairSpec, generate_pairs,
                                       injected, token_alignment)

CAPTIONS = ("a red cat sitting on a wooden table", "a red dog sitting on a wooden table")


@pytest.fixture(scope="module")
def pipe(tiny_models_dir):
    return load_sd(resolve_profile("tiny", tiny_models_dir).sd)


@pytest.fixture(scope="module")
def sharp_pipe(tiny_models_dir):
    """The tiny pipeline with its attention sharpened (query/key projections x10).

    Random-init attention is nearly uniform, so its maps carry no layout and sharing them cannot
    pull a pair together (or apart): there is nothing to share. A trained SD has peaked maps; the
    scaled projections give the tiny model peaked, content-dependent maps like that."""
    sharp = load_sd(resolve_profile("tiny", tiny_models_dir).sd)
    with torch.no_grad():
        for name, module in sharp.unet.named_modules():
            if name.endswith(("attn1", "attn2")):
                module.to_q.weight.mul_(10)
                module.to_k.weight.mul_(10)
    return sharp


def pair_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


@pytest.mark.parametrize("inject", ["self", "cross", "both"])
def test_injection_pulls_the_pair_together_and_leaves_the_original_untouched(sharp_pipe, inject):
    for seed in (1, 2, 3):
        run = {p: generate_pairs(sharp_pipe, *CAPTIONS, [PairSpec(seed, p, 7.5)], steps=4, size=64,
                                 inject=inject)
               for p in (0.0, 0.5, 1.0)}
        assert pair_distance(*run[1.0]) < pair_distance(*run[0.0]), seed
        # The original-caption image is bit-identical whatever p is.
        assert np.array_equal(run[0.0][0], run[1.0][0]) and np.array_equal(run[0.0][0], run[0.5][0])
        # Injection changes the counterfactual image.
        assert not np.array_equal(run[0.0][1], run[1.0][1])


def test_candidate_images_do_not_depend_on_the_batch(pipe):
    specs = [PairSpec(11, 0.3, 8.0), PairSpec(12, 0.9, 14.0), PairSpec(13, 0.6, 10.0)]
    batched = generate_pairs(pipe, *CAPTIONS, specs, steps=3, size=64)
    for k, spec in enumerate(specs):
        alone = generate_pairs(pipe, *CAPTIONS, [spec], steps=3, size=64)
        assert np.array_equal(batched[0][k], alone[0][0]) and np.array_equal(batched[1][k], alone[1][0])
    # Different seeds give different images (the seed really drives the latents).
    assert not np.array_equal(batched[0][0], batched[0][1])


def explicit_attention(attn: Attention, hidden, context, maps_from=None) -> torch.Tensor:
    """softmax(QK^T) V per head written out, optionally with Q, K (self) or the probabilities
    (cross) of rows `maps_from[i]` for row i."""
    q, k, v = attn.to_q(hidden), attn.to_k(context), attn.to_v(context)
    heads = attn.heads
    split = lambda t: t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    probs = (q @ k.transpose(-1, -2) * attn.scale).softmax(-1)
    if maps_from is not None:
        probs = maps_from(probs)
    out = (probs @ v).transpose(1, 2).reshape(hidden.shape[0], hidden.shape[1], -1)
    return attn.to_out[0](out)


def test_processors_inject_exactly_the_documented_maps():
    torch.manual_seed(0)
    attn = Attention(query_dim=16, heads=2, dim_head=8, cross_attention_dim=12).eval()
    self_attn = Attention(query_dim=16, heads=2, dim_head=8).eval()
    # 2 pairs -> UNet batch [uncond o1 c1 o2 c2 | cond o1 c1 o2 c2]; pair 0 injects, pair 1 not.
    specs = [PairSpec(0, 1.0, 7.5), PairSpec(1, 0.0, 7.5)]
    hidden = torch.randn(8, 6, 16)
    context = torch.randn(8, 5, 12)
    alignment = torch.tensor([0, 1, -1, 2, 4])  # token 2 is the swapped word; 3 <- 2 (shift)
    with torch.no_grad():
        ctrl = P2PController(specs, steps=3, inject="both", alignment=alignment)
        got_self = P2PAttnProcessor(ctrl, is_cross=False)(self_attn, hidden)
        got_cross = P2PAttnProcessor(ctrl, is_cross=True)(attn, hidden, context)

        def self_maps(probs):  # row 1 (uncond c1) and row 5 (cond c1) take rows 0 and 4
            out = probs.clone()
            out[[1, 5]] = probs[[0, 4]]
            return out

        def cross_maps(probs):  # conditional half only, aligned tokens only
            out = probs.clone()
            for k, src in enumerate(alignment.tolist()):
                if src >= 0:
                    out[5, :, :, k] = probs[4, :, :, src]
            return out

        want_self = explicit_attention(self_attn, hidden, hidden, self_maps)
        want_cross = explicit_attention(attn, hidden, context, cross_maps)
        plain = AttnProcessor()(attn, hidden, context)
    torch.testing.assert_close(got_self, want_self, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_cross, want_cross, atol=1e-5, rtol=1e-4)
    # Rows that are not injected equal diffusers' own attention.
    untouched = [0, 2, 3, 4, 6, 7]
    torch.testing.assert_close(got_cross[untouched], plain[untouched], atol=1e-5, rtol=1e-4)

    ctrl.step = 2  # the last step: 1.0 > 2/2 is false, nothing is injected
    with torch.no_grad():
        torch.testing.assert_close(P2PAttnProcessor(ctrl, is_cross=True)(attn, hidden, context),
                                   plain, atol=1e-5, rtol=1e-4)


def test_injection_schedule_and_token_alignment():
    assert [injected(0.5, i, 5) for i in range(5)] == [True, True, False, False, False]
    assert not any(injected(0.0, i, 5) for i in range(5))
    assert [injected(1.0, i, 3) for i in range(3)] == [True, True, False]
    # "a cat on it" vs "a big dog on it": prefix [bos, a], suffix [on, it, eos].
    src, tgt = [0, 5, 7, 8, 9, 1], [0, 5, 6, 6, 8, 9, 1]
    assert token_alignment(src, tgt, 9).tolist() == [0, 1, -1, -1, 3, 4, 5, 6, 7]


def test_image_stage_selects_the_best_passing_candidate_whatever_the_batch(pipe, tiny_models_dir):
    from builders.counterfactuals.images import ClipScorer, ImageStage, ImageStageConfig, candidate_specs
    from builders.infra.models.loaders import load_clip

    model, processor = load_clip(resolve_profile("tiny", tiny_models_dir).clip_filter)
    cfg = ImageStageConfig(candidates=5, candidate_batch=2, steps=2, image_size=64, clip_threshold=-1.0)
    specs = candidate_specs(0, "42_1", cfg)
    assert len({s.seed for s in specs}) == 5
    assert all(0.1 <= s.p <= 0.9 and 7.5 <= s.guidance <= 15 for s in specs)
    assert candidate_specs(0, "42_1", cfg) == specs and candidate_specs(1, "42_1", cfg) != specs

    # Independent scoring: every candidate alone, CLIP features normalised by hand.
    with torch.no_grad():
        text = model.get_text_features(**processor(text=list(CAPTIONS), return_tensors="pt",
                                                   padding=True)).pooler_output
        text = text / text.norm(dim=-1, keepdim=True)
        scores = []
        for spec in specs:
            im0, im1 = generate_pairs(pipe, *CAPTIONS, [spec], steps=2, size=64)
            feats = model.get_image_features(**processor(images=[im0[0], im1[0]],
                                                         return_tensors="pt")).pooler_output
            feats = feats / feats.norm(dim=-1, keepdim=True)
            d_img, d_txt = feats[1] - feats[0], text[1] - text[0]
            scores.append({"clip_0": float(feats[0] @ text[0]), "clip_1": float(feats[1] @ text[1]),
                           "dir": float(d_img @ d_txt / (d_img.norm() * d_txt.norm())),
                           "image": im1[0]})
    best = max(range(5), key=lambda k: scores[k]["dir"])
    scorer = ClipScorer(model, processor)
    results = {b: ImageStage(pipe, scorer, ImageStageConfig(**{**cfg.__dict__, "candidate_batch": b}),
                             seed=0).run("42_1", *CAPTIONS) for b in (1, 2, 5)}
    for result in results.values():
        assert result.seed == specs[best].seed and result.tried == result.passed == 5
        assert result.directional == pytest.approx(scores[best]["dir"], abs=1e-5)
        assert np.array_equal(np.asarray(result.image_1), scores[best]["image"])

    # A threshold between candidates' scores keeps exactly those above it; none above -> reason.
    clip_min = [min(s["clip_0"], s["clip_1"]) for s in scores]
    cut = sum(sorted(clip_min)[1:3]) / 2  # midway: float noise cannot move a candidate across
    kept = [k for k in range(5) if clip_min[k] >= cut]
    strict = ImageStage(pipe, scorer, ImageStageConfig(**{**cfg.__dict__, "clip_threshold": cut}),
                        seed=0).run("42_1", *CAPTIONS)
    assert strict.passed == len(kept) == 3
    assert strict.seed == specs[max(kept, key=lambda k: scores[k]["dir"])].seed
    none = ImageStage(pipe, scorer, ImageStageConfig(**{**cfg.__dict__, "clip_threshold": 1.01}),
                      seed=0).run("42_1", *CAPTIONS)
    assert none == "no_image_candidate_passed_clip"
    # Early stop at the 2nd pass: only the first two candidates count, for any batch size.
    for b in (1, 3):
        early = ImageStage(pipe, scorer, ImageStageConfig(**{**cfg.__dict__, "early_stop": 2,
                                                             "candidate_batch": b}),
                           seed=0).run("42_1", *CAPTIONS)
        assert early.tried == 2
        assert early.seed == specs[max((0, 1), key=lambda k: scores[k]["dir"])].seed
