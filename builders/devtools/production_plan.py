"""The planning arithmetic of the production table (`benchmarks/gpu_check.py`, #52 item 5): what
a build of the release costs per caption pair, counted from the candidate specs, and its GPU-days
from the stage costs the GPU run measures (builders/devtools/stage_rates.py).

Per caption pair, under a candidate plan at a model's reference steps (builders/counterfactuals/METHOD.md §2, "Reference
settings"; read from `GENERATORS`, never copied here):

- denoiser rows: `halves` (2 guidance halves, 1 for FLUX) per distinct row state (`row_keys`) a
  step, the state shared between candidates only with the shared computation;
- forwards (batch x step with a row), hence the rows a forward the rates are measured at;
- render calls (one a batch: each encodes its captions once);
- VAE decodes: the distinct row states at the preview step and at the last step;
- CLIP-scored candidate pairs: every candidate at the preview, every survivor at the end.

GPU seconds per caption pair = rows / (denoiser rows/s at the plan's rows a forward / the
injection factor) + calls x text encoding + decodes x VAE decode + scored pairs x CLIP filters.
Early rejection's rate is an assumption (`Assumptions`), printed in the table.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The release: caption pairs of the COCO-Counterfactuals build (builders/counterfactuals/METHOD.md §2).
RELEASE_CAPTION_PAIRS = 24_508
#: The paper's plan: 100 independent candidates in batches of `candidate_batch`'s default (4).
PAPER_PLAN = dict(candidates=100)
#: The production plan: 10 seeds x 10 p values, whole groups a batch, shared computation.
GROUPED_PLAN = dict(candidate_plan="grouped", seeds=10, p_values=10, candidate_batch=10)


@dataclass(frozen=True)
class Assumptions:
    """What the plan assumes rather than measures; every line is printed in the table."""

    caption_pairs: int = RELEASE_CAPTION_PAIRS
    #: Early rejection: preview after this fraction of the steps; this fraction of the previewed
    #: candidates dropped, drawn independently of p (unmeasured: it needs the real weights).
    reject_at: float = 0.5
    reject_rate: float = 0.5
    #: Caption pairs whose specs are counted (the counts are means over them).
    sample: int = 20

    def lines(self) -> list[str]:
        return [
            f"{self.caption_pairs:,} caption pairs (the release, builders/counterfactuals/METHOD.md §2)",
            f"early rejection: preview after {self.reject_at:g} of the steps, {self.reject_rate:.0%} of the "
            "previewed candidates dropped whatever their p (assumed: unmeasured without the real weights)",
            f"counts are means over the specs of {self.sample} caption pairs; no compiled model "
            "(no build compiles the denoiser)",
            "a known model other than the family's default is timed on the default's architecture and "
            "token lengths, at its own reference steps",
            "random weights: the work of a forward depends on the shapes, not on the values",
        ]


@dataclass(frozen=True)
class PlanCount:
    """Means per caption pair (module docstring)."""

    rows: float
    forwards: float
    calls: float
    decodes: float
    scored: float

    @property
    def rows_per_forward(self) -> float:
        return self.rows / self.forwards


def count_plan(plan: dict, share: bool, row_ids, steps: int, halves: int = 2, reject=None) -> PlanCount:
    """The counts of `plan` (ImageStageConfig fields) at `steps`, over the specs of `row_ids`
    (no model runs); `reject`, an `Assumptions`, adds early rejection (a seeded draw per caption
    pair drops `reject_rate` of the previewed candidates)."""
    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import candidate_batches, candidate_specs
    from builders.counterfactuals.prompt_to_prompt import row_keys

    cfg = ImageStageConfig(steps=steps, early_reject_at=reject.reject_at if reject else None, **plan)
    at = cfg.early_reject_step()
    rows = forwards = calls = decodes = scored = 0
    for row_id in row_ids:
        rng = random.Random(row_id)
        for batch in candidate_batches(candidate_specs(0, row_id, cfg), cfg.candidate_batch):
            calls += 1
            for i in range(steps):
                if not batch:
                    break
                states = len(set(row_keys(batch, steps, i, share)))
                rows, forwards = rows + halves * states, forwards + 1
                if i == at:
                    decodes, scored = decodes + states, scored + len(batch)
                    batch = [s for s in batch if rng.random() >= reject.reject_rate]
            if batch:
                decodes += len(set(row_keys(batch, steps, steps - 1, share)))
                scored += len(batch)
    n = len(row_ids)
    return PlanCount(rows / n, forwards / n, calls / n, decodes / n, scored / n)


def plans(assume: Assumptions) -> dict[str, tuple[dict, bool, Assumptions | None]]:
    """Name -> (ImageStageConfig fields, shared computation, early rejection)."""
    return {
        "paper plan (100 independent candidates)": (PAPER_PLAN, False, None),
        "production: grouped 10 x 10, shared": (GROUPED_PLAN, True, None),
        "production: grouped 10 x 10, shared + early rejection": (GROUPED_PLAN, True, assume),
    }


def model_steps(generator: str) -> list[tuple[str, int]]:
    """(Hub id, reference steps) of the family's default model and of each known model, read
    from the one table of reference settings (`model_references.FAMILIES`, the default first)."""
    from builders.counterfactuals.model_references import FAMILIES

    return [(m.hub_id, m.reference.steps) for m in FAMILIES[generator].models]


def release_counts(assume: Assumptions, steps: int, halves: int = 2) -> dict[str, PlanCount]:
    """Each plan's counts at `steps` with `halves` rows per branch state."""
    ids = [f"release-{k}" for k in range(assume.sample)]
    return {
        name: count_plan(plan, share, ids, steps, halves, reject)
        for name, (plan, share, reject) in plans(assume).items()
    }


@dataclass(frozen=True)
class StageCosts:
    """One generator's measured stage costs (seconds), at random weights on the table's device."""

    #: Text encoding of one render call (every encoder, both captions and the negative prompt).
    text_s: float
    #: One image through the VAE decoder.
    vae_s: float
    #: The CLIP filters of one candidate pair (its two images and the captions).
    clip_s: float
    #: Plain denoiser rows/s by rows a forward (the plans' batch sizes).
    rows_per_s: dict[int, float]
    #: Plain rows/s over rows/s inside the render (the injection's processors), at one batch.
    injection: float

    def rate_at(self, rows_per_forward: float) -> tuple[int, float]:
        """The measured batch nearest `rows_per_forward` and its rows/s."""
        rows = min(self.rows_per_s, key=lambda r: (abs(r - rows_per_forward), r))
        return rows, self.rows_per_s[rows]


def gpu_seconds(count: PlanCount, costs: StageCosts) -> float:
    """GPU seconds per caption pair (module docstring)."""
    _, rate = costs.rate_at(count.rows_per_forward)
    return (
        count.rows * costs.injection / rate
        + count.calls * costs.text_s
        + count.decodes * costs.vae_s
        + count.scored * costs.clip_s
    )


def gpu_days(count: PlanCount, costs: StageCosts, assume: Assumptions) -> float:
    return assume.caption_pairs * gpu_seconds(count, costs) / 86_400
