"""Prompt-to-Prompt attention injection: the processors compute what the method says (checked
against explicit attention maps), injection pulls the pair together, the original image never
depends on p, a candidate's images do not depend on its batch, and shared computation gives every
candidate the images it gets alone, with the UNet work a brute-force count of distinct row states
predicts."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor

from builders.models.loaders import load_sd
from builders.models.profiles import resolve_profile
from builders.counterfactuals.prompt_to_prompt import (
    P2PAttnProcessor,
    P2PController,
    PairSpec,
    UNetWork,
    generate_pairs,
    injected,
)
from builders.counterfactuals.word_swap import replacement_mapper

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
@pytest.mark.slow
def test_injection_pulls_the_pair_together_and_leaves_the_original_untouched(sharp_pipe, inject):
    for seed in (1, 2, 3):
        run = {
            p: generate_pairs(sharp_pipe, *CAPTIONS, [PairSpec(seed, p, 7.5)], steps=4, size=64, inject=inject)
            for p in (0.0, 0.5, 1.0)
        }
        assert pair_distance(*run[1.0]) < pair_distance(*run[0.0]), seed
        # The original-caption image is bit-identical whatever p is.
        assert np.array_equal(run[0.0][0], run[1.0][0]) and np.array_equal(run[0.0][0], run[0.5][0])
        # Injection changes the counterfactual image.
        assert not np.array_equal(run[0.0][1], run[1.0][1])


@pytest.mark.slow
def test_candidate_images_do_not_depend_on_the_batch(pipe):
    specs = [PairSpec(11, 0.3, 8.0), PairSpec(12, 0.9, 14.0), PairSpec(13, 0.6, 10.0)]
    batched = generate_pairs(pipe, *CAPTIONS, specs, steps=3, size=64)
    for k, spec in enumerate(specs):
        alone = generate_pairs(pipe, *CAPTIONS, [spec], steps=3, size=64)
        assert np.array_equal(batched[0][k], alone[0][0]) and np.array_equal(batched[1][k], alone[1][0])
    # Different seeds give different images (the seed really drives the latents).
    assert not np.array_equal(batched[0][0], batched[0][1])


#: 5 steps: p injects at steps i < 4p. Coinciding specs on purpose: p = 0.5 twice, p = 0.3 and
#: 0.5 (both inject at steps 0-1), p = 0 (never) and p = 1 (all but the last step); seed 21 with
#: two guidance scales (must not share) and a second seed; candidates of a group interleaved.
SHARED_SPECS = [
    PairSpec(21, 0.0, 7.5),
    PairSpec(21, 0.3, 7.5),
    PairSpec(22, 0.6, 7.5),
    PairSpec(21, 0.5, 7.5),
    PairSpec(21, 0.5, 7.5),
    PairSpec(21, 0.6, 7.5),
    PairSpec(21, 1.0, 12.0),
    PairSpec(21, 1.0, 7.5),
    PairSpec(21, 0.2, 7.5),
    PairSpec(21, 0.5, 12.0),
    PairSpec(22, 0.0, 7.5),
]


def distinct_row_states(specs, steps: int) -> int:
    """UNet rows a computation that evaluates each distinct state once needs, brute force: at
    step i an original row is told by (seed, guidance) and a counterfactual row by (seed,
    guidance, its injection decisions at steps 0..i); each counts twice (guidance halves)."""
    rows = 0
    for i in range(steps):
        originals = {(s.seed, s.guidance) for s in specs}
        branches = {(s.seed, s.guidance, tuple(injected(s.p, k, steps) for k in range(i + 1))) for s in specs}
        rows += 2 * (len(originals) + len(branches))
    return rows


@pytest.mark.parametrize(
    "inject,scheduler",
    [
        ("self", "euler_ancestral"),
        ("cross", "euler_ancestral"),
        ("both", "euler_ancestral"),
        ("self", "dpm_solver_pp"),
    ],
)
@pytest.mark.slow
def test_shared_computation_gives_each_candidate_its_own_images(sharp_pipe, inject, scheduler):
    steps, batch_sizes = 5, []
    hook = sharp_pipe.unet.register_forward_pre_hook(lambda _, args: batch_sizes.append(len(args[0])))
    try:
        work = UNetWork()
        shared = generate_pairs(
            sharp_pipe,
            *CAPTIONS,
            SHARED_SPECS,
            steps=steps,
            size=64,
            inject=inject,
            scheduler=scheduler,
            share=True,
            work=work,
        )
        counted = sum(batch_sizes)
        unshared = generate_pairs(
            sharp_pipe, *CAPTIONS, SHARED_SPECS, steps=steps, size=64, inject=inject, scheduler=scheduler, share=False
        )
    finally:
        hook.remove()
    # The reference: every candidate alone, nothing to share with.
    alone = [
        generate_pairs(sharp_pipe, *CAPTIONS, [spec], steps=steps, size=64, inject=inject, scheduler=scheduler)
        for spec in SHARED_SPECS
    ]
    for k, (im0, im1) in enumerate(alone):
        for side, image in ((0, im0[0]), (1, im1[0])):
            for got in (shared, unshared):  # uint8 images: at most one level of float noise
                assert np.abs(got[side][k].astype(int) - image.astype(int)).max() <= 1, (k, side)
    # The check can fail: counterfactuals injected for 0, 1 or 2 steps differ by more than the
    # tolerance, so a branch forked at the wrong step would show.
    cf = [alone[SHARED_SPECS.index(PairSpec(21, p, 7.5))][1][0].astype(int) for p in (0.0, 0.2, 0.5)]
    assert all(np.abs(a - b).max() > 1 for a, b in zip(cf, cf[1:], strict=False))
    # Work: the rows the UNet saw (counted at the UNet) are the brute-force count of distinct
    # states: 152 of the 220 rows of 11 independent candidates here.
    assert work.unet_rows == counted == distinct_row_states(SHARED_SPECS, steps) < 4 * steps * 11


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


#: Hand-written word-swap mappers (rows: source token, columns: target token) for 5 context
#: tokens. "[bos] a cat [eos]" -> "[bos] a hot|dog [eos]": each of the new word's 2 tokens takes
#: half of the old word's map (P2P's `get_replacement_mapper_` for words of different token
#: counts), and [eos] takes the map at its own position (4), not the old [eos]'s: P2P keeps the
#: following tokens in place.
SPREAD = torch.tensor(
    [[1, 0, 0.0, 0.0, 0], [0, 1, 0.0, 0.0, 0], [0, 0, 0.5, 0.5, 0], [0, 0, 0.0, 0.0, 0], [0, 0, 0.0, 0.0, 1]]
)
#: The other way round: the new word's single token takes the sum of the old word's 2 maps,
#: [eos] (position 3) the map at position 3, and the last position has no source (P2P's walk
#: through the old caption reached the end): it keeps its own.
SHRINK = torch.tensor([[1, 0, 0, 0, 0.0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])
#: A mapper for the processors' test (the shape of the old shifted alignment: any mapper will do).
MAPPER = torch.tensor([[1, 0, 0, 0, 0.0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0]])


def test_processors_inject_exactly_the_documented_maps():
    torch.manual_seed(0)
    attn = Attention(query_dim=16, heads=2, dim_head=8, cross_attention_dim=12).eval()
    self_attn = Attention(query_dim=16, heads=2, dim_head=8).eval()
    # 2 pairs -> UNet batch [uncond o1 c1 o2 c2 | cond o1 c1 o2 c2]; pair 0 injects, pair 1 not.
    specs = [PairSpec(0, 1.0, 7.5), PairSpec(1, 0.0, 7.5)]
    hidden = torch.randn(8, 6, 16)
    context = torch.randn(8, 5, 12)

    def self_maps(rows):  # row r of `rows` takes the self-attention map of row r - 1 (its original)
        def swap(probs):
            out = probs.clone()
            out[rows] = probs[[r - 1 for r in rows]]
            return out

        return swap

    def word_swap(probs):  # conditional c1 (row 5) from cond o1 (row 4), by the hand-written mapper
        out = probs.clone()
        for n in range(5):
            sources = MAPPER[:, n].nonzero().flatten().tolist()
            if sources:
                out[5, :, :, n] = sum(MAPPER[w, n] * probs[4, :, :, w] for w in sources)
        return out

    with torch.no_grad():
        plain = AttnProcessor()(attn, hidden, context)
        plain_self = AttnProcessor()(self_attn, hidden)
        both = P2PController(specs, steps=3, inject="both", mapper=MAPPER)
        # `self`/`both`: every self-attention layer, both halves of the guidance batch.
        torch.testing.assert_close(
            P2PAttnProcessor(both, is_cross=False)(self_attn, hidden),
            explicit_attention(self_attn, hidden, hidden, self_maps([1, 5])),
            atol=1e-5,
            rtol=1e-4,
        )
        got_cross = P2PAttnProcessor(both, is_cross=True)(attn, hidden, context)
        torch.testing.assert_close(
            got_cross, explicit_attention(attn, hidden, context, word_swap), atol=1e-5, rtol=1e-4
        )
        # Rows that are not injected equal diffusers' own attention.
        untouched = [0, 1, 2, 3, 4, 6, 7]
        torch.testing.assert_close(got_cross[untouched], plain[untouched], atol=1e-5, rtol=1e-4)

        # `cross`: the word swap, plus self maps only in low-resolution layers (here: at most 6
        # query positions), conditional half only.
        low = P2PController(specs, steps=3, inject="cross", mapper=MAPPER, low_res_tokens=6)
        high = P2PController(specs, steps=3, inject="cross", mapper=MAPPER, low_res_tokens=5)
        torch.testing.assert_close(
            P2PAttnProcessor(low, is_cross=True)(attn, hidden, context), got_cross, atol=1e-5, rtol=1e-4
        )
        torch.testing.assert_close(
            P2PAttnProcessor(low, is_cross=False)(self_attn, hidden),
            explicit_attention(self_attn, hidden, hidden, self_maps([5])),
            atol=1e-5,
            rtol=1e-4,
        )
        torch.testing.assert_close(
            P2PAttnProcessor(high, is_cross=False)(self_attn, hidden), plain_self, atol=1e-5, rtol=1e-4
        )

        both.step = 2  # the last step: 1.0 > 2/2 is false, nothing is injected
        torch.testing.assert_close(
            P2PAttnProcessor(both, is_cross=True)(attn, hidden, context), plain, atol=1e-5, rtol=1e-4
        )


def test_injection_schedule_and_word_swap_mapper():
    assert [injected(0.5, i, 5) for i in range(5)] == [True, True, False, False, False]
    assert not any(injected(0.0, i, 5) for i in range(5))
    assert [injected(1.0, i, 3) for i in range(3)] == [True, True, False]
    # Token ids: [bos] 0, a 5, cat 7, hot|dog 6 8 (one word, two tokens), [eos] 1.
    torch.testing.assert_close(replacement_mapper([0, 5, 7, 1], [0, 5, 6, 8, 1], 5), SPREAD)
    torch.testing.assert_close(replacement_mapper([0, 5, 6, 8, 1], [0, 5, 7, 1], 5), SHRINK)
    # Same token count: every token, the new word's included, maps one to one.
    torch.testing.assert_close(replacement_mapper([0, 5, 7, 8, 1], [0, 5, 9, 8, 1], 6), torch.eye(6))


def brute_force(scores: list[dict], cuts: dict[str, float]) -> tuple[int | None, dict[str, int]]:
    """Filter then argmax, written out: the index of the passing candidate with the highest
    directional score (the first on ties; None when none passes) and per filter how many
    candidates fail it."""
    fails = {
        "text_image": lambda s: min(s["clip_0"], s["clip_1"]) < cuts["text_image"],
        "image_image": lambda s: s["image"] < cuts["image_image"],
        "directional": lambda s: s["dir"] < cuts["directional"],
    }
    rejected = {name: sum(fails[name](s) for s in scores) for name in cuts}
    passing = [k for k, s in enumerate(scores) if not any(fails[name](s) for name in cuts)]
    best = None
    for k in passing:
        if best is None or scores[k]["dir"] > scores[best]["dir"]:
            best = k
    return best, rejected


@pytest.mark.slow
def test_image_stage_selects_the_best_passing_candidate_whatever_the_batch(pipe, tiny_models_dir):
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import ImageStage, candidate_specs
    from builders.models.clip import ClipScorer
    from builders.models.loaders import load_clip

    model, processor = load_clip(resolve_profile("tiny", tiny_models_dir).clip_filter)
    cfg = ImageStageConfig(
        candidates=5,
        candidate_batch=2,
        steps=2,
        image_size=64,
        clip_threshold=-1.0,
        image_similarity_threshold=-1.0,
        directional_threshold=-1.0,
    )
    assert ImageStageConfig().filters == ("text_image", "image_image", "directional")
    specs = candidate_specs(0, "42_1", cfg)
    assert len({s.seed for s in specs}) == 5
    assert all(0.1 <= s.p <= 0.9 and 7.5 <= s.guidance <= 15 for s in specs)
    assert candidate_specs(0, "42_1", cfg) == specs and candidate_specs(1, "42_1", cfg) != specs

    # Independent scoring: every candidate alone, CLIP features normalised by hand.
    with torch.no_grad():
        text = model.get_text_features(
            **processor(text=list(CAPTIONS), return_tensors="pt", padding=True)
        ).pooler_output
        text = text / text.norm(dim=-1, keepdim=True)
        scores, images = [], []
        for spec in specs:
            im0, im1 = generate_pairs(pipe, *CAPTIONS, [spec], steps=2, size=64)
            feats = model.get_image_features(**processor(images=[im0[0], im1[0]], return_tensors="pt")).pooler_output
            feats = feats / feats.norm(dim=-1, keepdim=True)
            d_img, d_txt = feats[1] - feats[0], text[1] - text[0]
            scores.append(
                {
                    "clip_0": float(feats[0] @ text[0]),
                    "clip_1": float(feats[1] @ text[1]),
                    "dir": float(d_img @ d_txt / (d_img.norm() * d_txt.norm())),
                    "image": float(feats[0] @ feats[1]),
                }
            )
            images.append(im1[0])
    best = max(range(5), key=lambda k: scores[k]["dir"])
    scorer = ClipScorer(model, processor)

    def run(**changes):
        return ImageStage(pipe, scorer, ImageStageConfig(**{**cfg.__dict__, **changes}), seed=0).run("42_1", *CAPTIONS)

    for b in (1, 2, 4, 7):
        result = run(candidate_batch=b)
        assert result.pair.seed == specs[best].seed and result.tried == result.passed == 5
        assert result.rejected == {"text_image": 0, "image_image": 0, "directional": 0}
        assert result.pair.directional == pytest.approx(scores[best]["dir"], abs=1e-5)
        # The candidate's own image, up to float rounding of batched kernels (docs/building.md): on
        # one CPU thread a batch of 4 moves one of 12,288 values by one level.
        diff = np.abs(np.asarray(result.pair.image_1).astype(int) - np.asarray(images[best]).astype(int))
        assert diff.max() <= 1 and np.count_nonzero(diff) <= diff.size // 1000, (b, diff.max(), np.count_nonzero(diff))

    # Thresholds between candidates' scores (midway: float noise cannot move a candidate
    # across): each filter alone keeps exactly those above it, and all three together select
    # what filter-then-argmax over the per-candidate scores selects, counting every failure.
    keys = {
        "text_image": lambda s: min(s["clip_0"], s["clip_1"]),
        "image_image": lambda s: s["image"],
        "directional": lambda s: s["dir"],
    }
    cuts = {name: sum(sorted(map(key, scores))[1:3]) / 2 for name, key in keys.items()}
    flags = {
        "text_image": "clip_threshold",
        "image_image": "image_similarity_threshold",
        "directional": "directional_threshold",
    }
    for name in cuts:
        alone = run(filters=(name,), **{flags[name]: cuts[name]})
        want, rejected = brute_force(scores, {name: cuts[name]})
        assert rejected == {name: 2} and alone.rejected == rejected and alone.passed == 3
        assert alone.pair.seed == specs[want].seed
    together = run(**{flags[name]: cut for name, cut in cuts.items()})
    want, rejected = brute_force(scores, cuts)
    assert together.rejected == rejected and together.tried == 5
    assert together.passed == 5 - len([s for s in scores if any(keys[n](s) < c for n, c in cuts.items())])
    assert (together.pair.seed if together.pair else None) == (specs[want].seed if want is not None else None)
    none = run(clip_threshold=1.01)
    assert none.pair is None and none.rejected == {"text_image": 5, "image_image": 0, "directional": 0}
    # Early stop at the 2nd pass: only the first two candidates count, for any batch size.
    for b in (1, 3):
        early = run(early_stop=2, candidate_batch=b)
        assert early.tried == 2
        assert early.pair.seed == specs[max((0, 1), key=lambda k: scores[k]["dir"])].seed


@pytest.mark.parametrize(
    "plan",
    [dict(candidates=5, candidate_batch=4), dict(candidate_plan="grouped", seeds=2, p_values=3, candidate_batch=6)],
)
@pytest.mark.slow
def test_an_image_batch_that_runs_out_of_memory_is_halved_with_the_same_selection(pipe, tiny_models_dir, plan, caplog):
    """The UNet runs out of memory above 4 rows (one candidate's pair with its guidance halves):
    batches are halved (a planned batch of whole groups re-planned at the new size), and the row's
    selection, counts and images are those of an un-failing run, with each candidate tried once."""
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import ImageStage
    from builders.models.clip import ClipScorer
    from builders.models.loaders import load_clip

    scorer = ClipScorer(*load_clip(resolve_profile("tiny", tiny_models_dir).clip_filter))
    cfg = ImageStageConfig(
        steps=2,
        image_size=64,
        clip_threshold=-1.0,
        image_similarity_threshold=-1.0,
        directional_threshold=-1.0,
        **plan,
    )
    want = ImageStage(pipe, scorer, cfg, seed=0).run("42_1", *CAPTIONS)
    rows: list[int] = []

    def oom_above_4(module, args):
        if len(args[0]) > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        rows.append(len(args[0]))

    stage = ImageStage(pipe, scorer, cfg, seed=0)
    hook = pipe.unet.register_forward_pre_hook(oom_above_4)
    try:
        with caplog.at_level(logging.INFO, logger="builders.engine.batching"):
            got = stage.run("42_1", *CAPTIONS)
    finally:
        hook.remove()
    assert rows and max(rows) <= 4 and stage.batches.size < cfg.candidate_batch
    assert got.tried == want.tried == cfg.candidates and got.passed == want.passed
    assert (got.rejected, got.early_rejected) == (want.rejected, want.early_rejected)
    # The same selection, images and work as a plain run at the size that fit. (Against the
    # configured size, CLIP scores of other batch sizes differ by float noise, ~1e-6, which can
    # reorder the tiny model's near-tied candidates of one group; with independent candidates
    # the selection is the same too.)
    plain = ImageStage(
        pipe, scorer, ImageStageConfig(**{**cfg.__dict__, "candidate_batch": stage.batches.size}), seed=0
    ).run("42_1", *CAPTIONS)
    assert (got.pair.seed, got.pair.p, got.work) == (plain.pair.seed, plain.pair.p, plain.work)
    assert np.array_equal(np.asarray(got.pair.image_0), np.asarray(plain.pair.image_0))
    assert np.array_equal(np.asarray(got.pair.image_1), np.asarray(plain.pair.image_1))
    assert got.pair.directional == pytest.approx(plain.pair.directional, abs=1e-5)
    if cfg.candidate_plan == "independent":
        assert (got.pair.seed, got.pair.p) == (want.pair.seed, want.pair.p)
    final = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(final) == 1 and f"batch size {stage.batches.size} " in final[0]


class PixelScorer:
    """A stand-in for CLIP: an image embeds as its centred, normalised pixels; the two captions
    embed as the given vectors. Pixel cosine makes "two images that differ everywhere" exact."""

    def __init__(self, text_0: torch.Tensor, text_1: torch.Tensor) -> None:
        self.text = torch.nn.functional.normalize(torch.stack([text_0, text_1]), dim=1)

    def texts(self, texts):
        return self.text

    def images(self, images):
        return pixel_embedding(np.asarray(images))


def pixel_embedding(images: np.ndarray) -> torch.Tensor:
    x = torch.tensor(images, dtype=torch.float64).flatten(1)
    x = x - x.mean(1, keepdim=True)
    return x / x.norm(dim=1, keepdim=True)


def test_image_image_filter_rejects_a_pair_that_differs_everywhere(monkeypatch):
    """A stub generator: candidate j's counterfactual image is its original with one corner
    redrawn, except candidate FLIP, whose counterfactual is the original's negative (it differs
    in every pixel). The captions' direction is chosen so that FLIP has the best directional
    score: the looser `--filters text_image` picks it, the paper's filters reject it as
    image-image, and the choice equals filter-then-argmax over per-candidate scores."""
    import builders.counterfactuals.prompt_to_prompt as p2p_module
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import ImageStage, candidate_specs

    cfg = ImageStageConfig(candidates=8, candidate_batch=3, clip_threshold=-1.0)
    specs = candidate_specs(0, "7_0", cfg)
    flip = 5

    def draw(spec: PairSpec) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(spec.seed % 2**32)
        original = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        if spec.seed == specs[flip].seed:
            return original, 255 - original
        edited = original.copy()
        edited[:3, :3] = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
        return original, edited

    def fake_generate(pipe, caption_0, caption_1, batch, **kwargs):
        pairs = [draw(spec) for spec in batch]
        return np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs])

    # The sd15 generator's renderer, which the image stage looks up in the registry per batch.
    monkeypatch.setattr(p2p_module, "generate_pairs", fake_generate)
    emb = {k: pixel_embedding(np.stack(draw(spec))) for k, spec in enumerate(specs)}
    change = lambda k: (emb[k][1] - emb[k][0]) / (emb[k][1] - emb[k][0]).norm()  # noqa: E731
    direction = change(flip) + sum(change(k) for k in emb if k != flip) / 3
    noise = torch.randn(192, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    text_0 = noise / noise.norm()
    text_1 = (text_0 + direction) / (text_0 + direction).norm()
    scorer = PixelScorer(text_0, text_1)
    scores = []
    for k in range(len(specs)):
        d_txt = text_1 - text_0
        scores.append(
            {
                "clip_0": float(emb[k][0] @ text_0),
                "clip_1": float(emb[k][1] @ text_1),
                "image": float(emb[k][0] @ emb[k][1]),
                "dir": float(change(k) @ d_txt / d_txt.norm()),
            }
        )
    assert max(range(len(specs)), key=lambda k: scores[k]["dir"]) == flip
    assert scores[flip]["image"] == pytest.approx(-1.0)

    loose = ImageStage(None, scorer, ImageStageConfig(**{**cfg.__dict__, "filters": ("text_image",)}), seed=0).run(
        "7_0", "c0", "c1"
    )
    assert loose.pair.seed == specs[flip].seed and loose.passed == len(specs)
    paper = ImageStage(None, scorer, cfg, seed=0).run("7_0", "c0", "c1")
    want, rejected = brute_force(scores, {"text_image": -1.0, "image_image": 0.7, "directional": 0.2})
    assert want is not None and want != flip and rejected["image_image"] >= 1
    assert paper.pair.seed == specs[want].seed and paper.rejected == rejected
    assert paper.pair.image_similarity == pytest.approx(scores[want]["image"], abs=1e-6)
