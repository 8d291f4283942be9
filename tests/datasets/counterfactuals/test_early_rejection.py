"""Early rejection (`--early-reject-at F --early-reject-margin M`, an approximate option):
candidates dropped on their x0 preview leave the batch, the survivors keep exactly the images
they get without it (for either sampler and with shared computation), the UNet work shrinks by
the dropped candidates' remaining rows, the preview is the sampler's x0 prediction, and the
build counts the dropped candidates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from builders.counterfactuals.config import ImageStageConfig
from builders.counterfactuals.images import ImageStage
from builders.models.clip import ClipScorer
from builders.counterfactuals.prompt_to_prompt import (
    EarlyRejection,
    PairSpec,
    UNetWork,
    generate_pairs,
)
from builders.counterfactuals.samplers import make_scheduler, predicted_x0
from builders.app.cli import main as cli_main
from builders.models.loaders import load_sd
from builders.models.profiles import resolve_profile

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

CAPTIONS = ("a red cat sitting on a wooden table", "a red dog sitting on a wooden table")
#: Two groups sharing (seed, guidance) and two loners, so dropping one candidate of a group
#: leaves its group-mates sharing rows.
SPECS = [
    PairSpec(31, 0.2, 7.5),
    PairSpec(31, 0.6, 7.5),
    PairSpec(32, 0.5, 9.0),
    PairSpec(31, 0.9, 7.5),
    PairSpec(33, 0.4, 11.0),
    PairSpec(32, 0.8, 9.0),
]
STEPS = 6


@pytest.fixture(scope="module")
def pipe(tiny_models_dir):
    return load_sd(resolve_profile("tiny", tiny_models_dir).sd)


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """uint8 images within one level (float noise of different batch shapes)."""
    return np.abs(a.astype(int) - b.astype(int)).max() <= 1


@pytest.mark.parametrize(
    "scheduler,share", [("euler_ancestral", True), ("euler_ancestral", False), ("dpm_solver_pp", True)]
)
def test_survivors_keep_their_images_and_the_dropped_stop_costing(pipe, scheduler, share):
    kwargs = dict(steps=STEPS, size=64, scheduler=scheduler, share=share)
    full_work = UNetWork()
    full = generate_pairs(pipe, *CAPTIONS, SPECS, work=full_work, **kwargs)

    drop = {1, 4}
    seen = []

    def check(previews_0, previews_1):
        seen.append((previews_0.shape, previews_1.shape))
        return [j not in drop for j in range(len(previews_0))]

    early, work = EarlyRejection(step=2, check=check), UNetWork()
    got = generate_pairs(pipe, *CAPTIONS, SPECS, work=work, early=early, **kwargs)
    assert early.dropped == sorted(drop)
    assert seen == [((len(SPECS), 64, 64, 3), (len(SPECS), 64, 64, 3))]
    kept = [j for j in range(len(SPECS)) if j not in drop]
    assert len(got[0]) == len(got[1]) == len(kept)
    for row, j in enumerate(kept):
        assert close(got[0][row], full[0][j]) and close(got[1][row], full[1][j]), j
    # The saving is the UNet rows the dropped candidates would have needed after step 2: the
    # same computation on the survivors alone from step 3 on.
    survivors_work = UNetWork()
    generate_pairs(pipe, *CAPTIONS, [SPECS[j] for j in kept], work=survivors_work, **kwargs)
    per_step = lambda w: w.unet_rows / STEPS  # noqa: E731
    if not share:  # independent rows: each candidate costs 4 rows a step
        assert full_work.unet_rows == 4 * STEPS * len(SPECS)
        assert work.unet_rows == 4 * 3 * len(SPECS) + 4 * 3 * len(kept)
    assert work.unet_rows < full_work.unet_rows
    assert survivors_work.unet_rows <= work.unet_rows and per_step(survivors_work) > 0

    # Keeping everyone changes nothing (but the preview's decode).
    everyone = EarlyRejection(step=2, check=lambda a, b: [True] * len(a))
    same_work = UNetWork()
    same = generate_pairs(pipe, *CAPTIONS, SPECS, work=same_work, early=everyone, **kwargs)
    assert everyone.dropped == [] and same_work.unet_rows == full_work.unet_rows
    assert all(close(x, y) for x, y in zip(same[0], full[0], strict=True)) and all(
        close(x, y) for x, y in zip(same[1], full[1], strict=True)
    )

    # Dropping everyone returns no images and stops the loop.
    nobody = EarlyRejection(step=1, check=lambda a, b: [False] * len(a))
    calls = []
    hook = pipe.unet.register_forward_pre_hook(lambda _, args: calls.append(len(args[0])))
    try:
        empty = generate_pairs(pipe, *CAPTIONS, SPECS, early=nobody, **kwargs)
    finally:
        hook.remove()
    assert nobody.dropped == list(range(len(SPECS))) and empty[0].shape == (0, 64, 64, 3)
    assert len(calls) == 2, "the UNet ran after every candidate was dropped"


@pytest.mark.parametrize("scheduler", ["euler_ancestral", "dpm_solver_pp"])
def test_the_preview_is_the_samplers_x0_prediction(pipe, scheduler):
    """The preview decodes `predicted_x0`. At the last step both samplers step to sigma = 0,
    where the sample they return is their x0 prediction: there `predicted_x0` must equal the
    returned sample, and at earlier steps (noise left) it must not."""
    sched = make_scheduler(pipe, scheduler)
    sched.set_timesteps(5)
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 8, 8, generator=gen) * sched.init_noise_sigma
    for i, t in enumerate(sched.timesteps):
        eps = torch.randn(latents.shape, generator=gen)
        out = sched.step(eps, t, latents, generator=torch.Generator().manual_seed(i))
        x0 = predicted_x0(sched, out)
        if i == len(sched.timesteps) - 1:
            torch.testing.assert_close(x0, out.prev_sample)
        else:
            assert (x0 - out.prev_sample).abs().mean() > 1e-2, i
        latents = out.prev_sample


class ScriptedScorer(ClipScorer):
    """A CLIP stand-in whose caption-image score of an image is its mean brightness mapped to
    [-1, 1]: previews and final images are scored by what they show, deterministically."""

    def __init__(self) -> None:
        pass

    def texts(self, texts):
        return torch.nn.functional.normalize(torch.ones(len(texts), 2, dtype=torch.float64), dim=-1)

    def images(self, images):
        b = torch.tensor(np.asarray(images, dtype=np.float64).mean(axis=(1, 2, 3)) / 127.5 - 1.0)
        # Unit vectors at angle theta from (1, 1)/sqrt(2) with cos(theta) = brightness score.
        theta = torch.arccos(b.clamp(-1, 1))
        base = torch.pi / 4
        return torch.stack([torch.cos(base - theta), torch.sin(base - theta)], dim=-1)


def test_image_stage_counts_early_rejections_and_margin_inf_changes_nothing(pipe):
    base = dict(
        candidates=6, candidate_batch=3, steps=STEPS, image_size=64, filters=("text_image",), clip_threshold=0.0
    )
    scorer = ScriptedScorer()
    exact = ImageStage(pipe, scorer, ImageStageConfig(**base), seed=0).run("5_0", *CAPTIONS)
    lax = ImageStage(
        pipe, scorer, ImageStageConfig(**base, early_reject_at=0.5, early_reject_margin=float("inf")), seed=0
    ).run("5_0", *CAPTIONS)
    assert lax.early_rejected == 0 and (lax.tried, lax.passed) == (exact.tried, exact.passed)
    assert (lax.pair is None) == (exact.pair is None)
    if exact.pair is not None:
        assert (lax.pair.seed, lax.pair.p) == (exact.pair.seed, exact.pair.p)
    strict = ImageStage(
        pipe,
        scorer,
        ImageStageConfig(**{**base, "clip_threshold": 2.0}, early_reject_at=0.5, early_reject_margin=0.0),
        seed=0,
    ).run("5_0", *CAPTIONS)
    # No preview can reach a cosine of 2: every candidate stops early, none is finished.
    assert strict.early_rejected == strict.tried == 6 and strict.passed == 0 and strict.pair is None
    assert strict.rejected == {"text_image": 0}
    assert strict.work.unet_rows < exact.work.unet_rows


def test_build_flags_record_and_count_early_rejection(coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path):
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "build",
                "coco-counterfactuals",
                "--coco-root",
                str(coco_fixture_dir),
                "--karpathy-splits",
                "test",
                "--max-captions",
                "2",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--output",
                str(out),
                "--steps",
                "4",
                "--early-reject-at",
                "0.5",
                "--early-reject-margin",
                "0",
                "--clip-threshold",
                "2",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "build_manifest.json").read_text())
    images = manifest["config"]["images"]
    assert (images["early_reject_at"], images["early_reject_margin"]) == (0.5, 0.0)
    counts = manifest["counts"]
    assert counts["image_rejected_early"] == counts["image_candidates_tried"] > 0
    assert counts["image_candidates_passed"] == 0
    card = " ".join((out / "README.md").read_text().split())
    assert f"{counts['image_rejected_early']} candidates whose preview missed a threshold" in card
    for bad in (["--early-reject-at", "1.5"], ["--early-reject-margin", "-1"]):
        assert (
            cli_main(
                [
                    "build",
                    "coco-counterfactuals",
                    "--coco-root",
                    str(coco_fixture_dir),
                    "--models",
                    "tiny",
                    "--tiny-models-dir",
                    str(tiny_models_dir),
                    "--output",
                    str(tmp_path / "bad"),
                    *bad,
                ]
            )
            == 2
        )
