"""Counterfactual image pairs (builders/counterfactuals/METHOD.md §2): over-generate, filter with CLIP, pick the best.

For a caption pair (C_o, C_c) with row id `r`, the candidate plan (`candidate_plan`) draws the
specs:
- `independent` (the paper's sampling): candidate j (0 <= j < N) gets
  `seed_j = derive_seed(seed, r, "candidate", j)` and, from a generator seeded with it,
  `p_j ~ U(0.1, 0.9)` and guidance `g_j ~ U(7.5, 15)`;
- `grouped`: group k (0 <= k < K = `seeds`) gets `seed_k = derive_seed(seed, r, "group", k)`
  and, from a generator seeded with it, one guidance `g_k ~ U(7.5, 15)` and M = `p_values`
  injection fractions, one uniform draw in each of M equal slices of the p range (stratified:
  every p is still U(0.1, 0.9) over the candidates), in increasing order.
Candidates go through the generator (`builders.counterfactuals.generators`; by default Stable
Diffusion v1.5 with Prompt-to-Prompt, `builders.counterfactuals.prompt_to_prompt`) about
`candidate_batch` at a time, a batch holding whole groups of candidates that share (seed,
guidance) so that they share their UNet work (`share`); a candidate's images depend only on its
own (seed, p, g), so the output does not depend on the plan's batching, the batch size, the batch
position or the process count.

A candidate passes every filter of `filters` (all three by default, as in App. B.1.2 of the
paper with the instruct-pix2pix generator's defaults):
- `text_image`: `cos(E_T(C_o), E_I(I_o)) >= clip_threshold` and
  `cos(E_T(C_c), E_I(I_c)) >= clip_threshold` (0.2);
- `image_image`: `cos(E_I(I_o), E_I(I_c)) >= image_similarity_threshold` (0.7), so the two images
  cannot differ everywhere;
- `directional`: `CLIP_dir >= directional_threshold` (0.2), with
  `CLIP_dir = cos(E_T(C_c) - E_T(C_o), E_I(I_c) - E_I(I_o))`.
Every filter a candidate fails is counted (`ImageSelection.rejected`; a candidate can fail
several). Among the passing candidates the highest `CLIP_dir` wins (the lowest index on ties).
With `early_stop = K`, generation stops at the candidate where the K-th pass happens and only
candidates up to it are considered, whatever the batch size. With `early_reject_at` (approximate,
off by default), a candidate whose predicted clean image at that fraction of the steps fails a
filter by more than `early_reject_margin` is not denoised further (`ImageSelection.early_rejected`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from builders.counterfactuals.config import ImageStageConfig
from builders.counterfactuals.generators import generator
from builders.counterfactuals.model_references import check_loaded
from builders.counterfactuals.prompt_to_prompt import EarlyRejection, PairSpec, UNetWork
from builders.engine import progress
from builders.engine.batching import ShrinkingBatches
from builders.engine.seeding import derive_seed
from builders.models.clip import ClipScorer

NO_PASSING_CANDIDATE = "no_image_candidate_passed_clip"
#: Caption pairs the generator cannot draw apart (`ImageStage.unseen_edit`): its text encoders
#: get the same tokens for both captions, so both images of every candidate would be the same.
EDIT_BEYOND_TEXT_ENCODER = "edit_beyond_text_encoder"
EDIT_INVISIBLE_TO_TEXT_ENCODER = "edit_invisible_to_text_encoder"


@dataclass
class ImagePair:
    image_0: Image.Image
    image_1: Image.Image
    seed: int
    p: float
    guidance: float
    clip_0: float
    clip_1: float
    directional: float
    image_similarity: float


@dataclass
class ImageSelection:
    """What `ImageStage.run` found for one caption pair: the chosen pair (None when no candidate
    passed), how many candidates were generated and passed, per filter of the config how
    many finished candidates failed it, how many were dropped early on their preview, and the
    UNet / decoder work it took."""

    pair: ImagePair | None
    tried: int = 0
    passed: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    early_rejected: int = 0
    work: UNetWork = field(default_factory=UNetWork)


def candidate_specs(seed: int, row_id: str, cfg: ImageStageConfig) -> list[PairSpec]:
    """The candidates of one caption pair under `cfg.candidate_plan` (module docstring)."""
    specs = []
    if cfg.candidate_plan == "grouped":
        lo, hi = cfg.p_range
        width = (hi - lo) / cfg.p_values
        for k in range(cfg.seeds):
            s = derive_seed(seed, row_id, "group", k)
            rng = random.Random(s)
            guidance = rng.uniform(*cfg.guidance_range)
            specs += [
                PairSpec(seed=s, p=lo + width * (m + rng.random()), guidance=guidance) for m in range(cfg.p_values)
            ]
        return specs
    for j in range(cfg.candidates):
        s = derive_seed(seed, row_id, "candidate", j)
        rng = random.Random(s)
        spec = PairSpec(seed=s, p=rng.uniform(*cfg.p_range), guidance=rng.uniform(*cfg.guidance_range))
        if cfg.cross_replace_fraction is not None:  # Prompt-to-Prompt's two fixed fractions (same draws)
            spec = replace(spec, p=cfg.cross_replace_fraction, p_self=cfg.self_replace_fraction)
        specs.append(spec)
    return specs


def candidate_batches(specs: Sequence[PairSpec], size: int) -> list[list[PairSpec]]:
    """Consecutive batches of about `size` candidates that never split a run of candidates
    sharing (seed, guidance): a batch closes before a group that would overflow it, and a group
    larger than `size` is a batch of its own."""
    groups: list[list[PairSpec]] = []
    for spec in specs:
        if groups and (groups[-1][0].seed, groups[-1][0].guidance) == (spec.seed, spec.guidance):
            groups[-1].append(spec)
        else:
            groups.append([spec])
    batches: list[list[PairSpec]] = []
    for group in groups:
        if batches and len(batches[-1]) + len(group) <= size:
            batches[-1] += group
        else:
            batches.append(list(group))
    return batches


def split_candidates(specs: Sequence[PairSpec], size: int) -> list[list[PairSpec]]:
    """`candidate_batches` of at most `size` candidates, cutting a group that is larger (used
    once memory ran out: a candidate's images do not depend on its group mates)."""
    return [batch[i : i + size] for batch in candidate_batches(specs, size) for i in range(0, len(batch), size)]


@dataclass
class _Scores:
    clip_0: torch.Tensor
    clip_1: torch.Tensor
    directional: torch.Tensor
    image_similarity: torch.Tensor


def score_pairs(
    scorer: ClipScorer, caption_0: str, caption_1: str, images_0: np.ndarray, images_1: np.ndarray
) -> _Scores:
    t0, t1 = scorer.texts([caption_0, caption_1])
    i0, i1 = scorer.images(images_0), scorer.images(images_1)
    direction = torch.nn.functional.cosine_similarity((i1 - i0), (t1 - t0).unsqueeze(0), dim=-1)
    return _Scores(clip_0=i0 @ t0, clip_1=i1 @ t1, directional=direction, image_similarity=(i0 * i1).sum(-1))


def row_scores(
    scorer: ClipScorer,
    captions_0: Sequence[str],
    captions_1: Sequence[str],
    images_0: Sequence[Any],
    images_1: Sequence[Any],
) -> _Scores:
    """`score_pairs`' four scores for rows that each have their own captions (imported pairs:
    row k's images with row k's captions), one text and two image batches for all rows."""
    n = len(captions_0)
    texts = scorer.texts([*captions_0, *captions_1])
    t0, t1 = texts[:n], texts[n:]
    i0, i1 = scorer.images(images_0), scorer.images(images_1)
    direction = torch.nn.functional.cosine_similarity(i1 - i0, t1 - t0, dim=-1)
    return _Scores(
        clip_0=(i0 * t0).sum(-1), clip_1=(i1 * t1).sum(-1), directional=direction, image_similarity=(i0 * i1).sum(-1)
    )


def failed_filters(cfg: ImageStageConfig, s: _Scores, k: int, margin: float = 0.0) -> list[str]:
    """The filters of `cfg.filters` that pair k of `s` fails by more than `margin`."""
    ok = {
        "text_image": min(s.clip_0[k].item(), s.clip_1[k].item()) >= cfg.clip_threshold - margin,
        "image_image": s.image_similarity[k].item() >= cfg.image_similarity_threshold - margin,
        "directional": s.directional[k].item() >= cfg.directional_threshold - margin,
    }
    return [name for name in cfg.filters if not ok[name]]


class ImageStage:
    """`run(row_id, caption_0, caption_1)` -> an `ImageSelection`."""

    def __init__(self, pipe: Any, scorer: ClipScorer, config: ImageStageConfig, seed: int) -> None:
        # The loaded model's reference entry, which must be the one the config was resolved with
        # (`model_references.check_loaded`): its T5 length is the one the stage reads.
        reference = check_loaded(config.generator, pipe, config.reference)
        self.pipe, self.scorer, self.config, self.seed = pipe, scorer, replace(config, reference=reference), seed
        # Generation and the CLIP filters of a batch, halved and retried on out-of-memory.
        self.batches = ShrinkingBatches(
            "image stage (generator + CLIP filters)",
            config.candidate_batch,
            hint="try a smaller --image-size, --dtype fp16 or a GPU with more memory",
        )

    def unseen_edit(self, caption_0: str, caption_1: str) -> str | None:
        """Why the generator cannot draw this edit, or None. Each of its text encoders reads the
        first tokens of a caption up to its limit (`GeneratorSpec.tokenizers`: 77 with the start
        and end tokens for CLIP, the pipeline's `max_sequence_length` for T5), tokenized as the
        pipeline does. When every encoder reads the same tokens for both captions, the two
        images of every candidate are identical (directional similarity 0):
        `edit_beyond_text_encoder` when the captions' tokens differ only past the limits,
        `edit_invisible_to_text_encoder` when the tokenizers make them the same anyway (CLIP's
        lowercases: `A Dog` / `A dog`). Checked before generating anything."""
        limits = generator(self.config.generator).token_limits(self.pipe, self.config.reference)
        for tokenizer, limit in limits:
            seen = [tokenizer(c, truncation=True, max_length=limit).input_ids for c in (caption_0, caption_1)]
            if seen[0] != seen[1]:
                return None
        # verbose=False: no "longer than the maximum" warning per caption.
        full = [[tokenizer(c, verbose=False).input_ids for tokenizer, _ in limits] for c in (caption_0, caption_1)]
        return EDIT_BEYOND_TEXT_ENCODER if full[0] != full[1] else EDIT_INVISIBLE_TO_TEXT_ENCODER

    def early_rejection(self, caption_0: str, caption_1: str) -> EarlyRejection | None:
        step = self.config.early_reject_step()
        if step is None:
            return None

        def check(previews_0: np.ndarray, previews_1: np.ndarray) -> list[bool]:
            scores = score_pairs(self.scorer, caption_0, caption_1, previews_0, previews_1)
            return [
                not failed_filters(self.config, scores, k, self.config.early_reject_margin)
                for k in range(len(previews_0))
            ]

        return EarlyRejection(step, check)

    def run(self, row_id: str, caption_0: str, caption_1: str) -> ImageSelection:
        cfg = self.config
        specs = candidate_specs(self.seed, row_id, cfg)
        best: ImagePair | None = None
        passed = tried = early_rejected = 0
        rejected = dict.fromkeys(cfg.filters, 0)
        work = UNetWork()
        start = 0
        planned = candidate_batches(specs, max(1, cfg.candidate_batch))
        generate = lambda batch: self._generate(caption_0, caption_1, batch)  # noqa: E731
        progress.stage("candidates", start, len(specs))
        for batch, (images_0, images_1, dropped, scores, done) in self.batches.run(
            planned, generate, split_candidates
        ):
            start += len(batch)
            progress.stage("candidates", start, len(specs))
            work.unet_rows += done.unet_rows
            work.decoded += done.decoded
            k = -1  # position among the finished candidates (the images' rows)
            for j, spec in enumerate(batch):
                tried += 1
                if j in dropped:
                    early_rejected += 1
                    continue
                k += 1
                failed = failed_filters(cfg, scores, k)
                for name in failed:
                    rejected[name] += 1
                if failed:
                    continue
                passed += 1
                if best is None or scores.directional[k].item() > best.directional:
                    best = ImagePair(
                        image_0=Image.fromarray(images_0[k]),
                        image_1=Image.fromarray(images_1[k]),
                        seed=spec.seed,
                        p=spec.p,
                        guidance=spec.guidance,
                        clip_0=scores.clip_0[k].item(),
                        clip_1=scores.clip_1[k].item(),
                        directional=scores.directional[k].item(),
                        image_similarity=scores.image_similarity[k].item(),
                    )
                if cfg.early_stop is not None and passed >= cfg.early_stop:
                    break
            if cfg.early_stop is not None and passed >= cfg.early_stop:
                break
        return ImageSelection(best, tried, passed, rejected, early_rejected, work)

    def _generate(self, caption_0: str, caption_1: str, batch: Sequence[PairSpec]):
        """One batch's images, early-rejected positions, CLIP scores and UNet work; fresh state
        per attempt, so a batch retried after running out of memory counts its work once."""
        cfg = self.config
        early = self.early_rejection(caption_0, caption_1)
        work = UNetWork()
        spec = generator(cfg.generator)
        images_0, images_1 = spec.renderer()(
            self.pipe,
            caption_0,
            caption_1,
            batch,
            steps=cfg.steps,
            size=cfg.image_size,
            share=cfg.share,
            work=work,
            early=early,
            **{name: getattr(cfg, name) for name in spec.options},
        )
        dropped = set(early.dropped) if early else set()
        scores = score_pairs(self.scorer, caption_0, caption_1, images_0, images_1) if len(images_0) else None
        return images_0, images_1, dropped, scores, work
