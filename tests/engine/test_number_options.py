"""Numbers are refused where they are parsed (#49; builders/engine/option_types.py): a guidance,
learning rate or timeout of `nan`/`inf`, a side the generator's VAE cannot draw, steps outside
1..1000, a seed outside 32 bits. Each is one line naming the option and what to give, before any
model loads and before anything is written, through the CLI a user types."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.app.cli import main as cli_main


def _refused(argv: list[str], capsys) -> str:
    """The one error line of a command that stops before any work (argparse's usage error, or
    `counterfactory: error:` from the config's checks), with no traceback."""
    try:
        code = cli_main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2, code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(lines) == 1, err
    return lines[0]


def _images(tmp_path: Path, tiny: Path, *extra: str) -> list[str]:
    """`--stage images` of one caption pair with the tiny models: seconds when it runs."""
    table = tmp_path / "pairs.tsv"
    table.write_text("9\tTwo dogs sleep on the couch.\tTwo cats sleep on the couch.\n")
    return [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny), "--output", str(tmp_path / "out")),
        *("--steps", "2", "--candidates", "1", *extra),
    ]


@pytest.mark.parametrize(
    "ends, says",
    [
        (("nan", "nan"), "argument --guidance-range: expected a finite number, got 'nan'"),
        (("inf", "inf"), "argument --guidance-range: expected a finite number, got 'inf'"),
        (("-1", "2"), "argument --guidance-range: must be at least 0 (got -1)"),
        (("15", "7.5"), "--guidance-range 15 7.5: give the low end first (7.5 15)"),
    ],
)
def test_a_guidance_range_that_is_no_range_of_scales_is_refused(ends, says, tmp_path, tiny_models_dir, capsys):
    """`--guidance-range nan nan` drew all-black images under a card saying U(nan, nan)."""
    line = _refused(_images(tmp_path, tiny_models_dir, "--guidance-range", *ends), capsys)
    assert says in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "generator, size, says",
    [
        ("sd15", "7", "--image-size 7: the sd15 generator draws images whose side is a multiple of 8 pixels; give 8"),
        ("sd15", "60", "multiple of 8 pixels; give 56 or 64"),
        ("sd3", "1000", "--image-size 1000: the sd3 generator draws images whose side is a multiple of 16 pixels"),
        ("flux", "72", "multiple of 16 pixels; give 64 or 80"),
    ],
)
def test_an_image_size_the_vae_cannot_draw_is_refused(generator, size, says, tmp_path, tiny_models_dir, capsys):
    """`--image-size 7` stored 6 x 6 images (the tiny VAE halves twice) in rows that said 7."""
    argv = _images(tmp_path, tiny_models_dir, "--generator", generator, "--image-size", size)
    line = _refused(argv, capsys)
    assert says in line, line
    assert not (tmp_path / "out").exists()


def test_build_steps_and_seed_out_of_range_are_refused(tmp_path, tiny_models_dir, capsys):
    line = _refused(_images(tmp_path, tiny_models_dir, "--steps", "1001"), capsys)
    assert "argument --steps: must be at most 1000, the schedulers' training timesteps (got 1001)" in line
    line = _refused(_images(tmp_path, tiny_models_dir, "--seed", str(2**70)), capsys)
    assert f"argument --seed: must be at most {2**32 - 1}" in line, line
    assert not (tmp_path / "out").exists()


def _vital(tmp_path: Path, tiny: Path, *extra: str) -> list[str]:
    out = tmp_path / "v.json"
    return [
        *("doctor", "vital-layers", "--generator", "flux", "--models", "tiny", "--tiny-models-dir", str(tiny)),
        *("--prompts", "a red cat", "--output", str(out), *extra),
    ]


@pytest.mark.parametrize(
    "extra, says",
    [
        # 0 became the model's 28 reference steps, silently.
        (("--steps", "0"), "argument --steps: must be at least 1 (got 0)"),
        (("--steps", "100000"), "argument --steps: must be at most 1000"),
        # An overflow traceback from torch.Generator.manual_seed, after the models loaded.
        (("--seed", "1180591620717411303424"), "argument --seed: must be at most 4294967295"),
        (("--seed", "-1"), "argument --seed: must be at least 0 (got -1)"),
        # Sample i draws seed --seed + i.
        (("--seed", "4294967295", "--samples", "2"), "its samples draw seeds up to 4294967296, past 4294967295"),
        (("--image-size", "100"), "--image-size 100: the flux generator draws images whose side is a multiple of 16"),
    ],
)
def test_vital_layers_numbers_out_of_range_are_refused(extra, says, tmp_path, tiny_models_dir, capsys):
    line = _refused(_vital(tmp_path, tiny_models_dir, *extra), capsys)
    assert says in line, line
    assert not (tmp_path / "v.json").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
        (["train", "--lr", "0"], "argument --lr: must be above 0 (got 0)"),
        (["train", "--max-grad-norm", "inf"], "argument --max-grad-norm: expected a finite number, got 'inf'"),
        (
            ["train", "--mix", "decorrelation", "--decorrelation", "no-such-build", "--ratio", "nan"],
            "argument --ratio: expected a finite number, got 'nan'",
        ),
        (["train", "--seed", str(2**64)], "argument --seed: must be at most 4294967295"),
        (["train", "--data-seed", str(2**32)], "argument --data-seed: must be at most 4294967295"),
        (["benchmark", "--seed", str(2**63)], "argument --seed: must be at most 4294967295"),
        (["build", "decorrelation", "--guidance-scale", "nan"], "argument --guidance-scale: expected a finite number"),
        (["build", "decorrelation", "--inpaint-steps", "1001"], "argument --inpaint-steps: must be at most 1000"),
        (["build", "decorrelation", "--blur-radius", "inf"], "argument --blur-radius: expected a finite number"),
        (["publish", "--timeout", "nan"], "argument --timeout: expected a finite number, got 'nan'"),
    ],
)
def test_other_numbers_out_of_range_are_refused_where_parsed(argv, says, tmp_path, capsys):
    """Every other flag the command needs is given, so the number is the one thing wrong."""
    missing, out = tmp_path / "missing", tmp_path / "out"
    needs = {
        "train": ["--real", str(missing), "--output", str(out)],
        "benchmark": ["--model", str(missing), "--decorrelation", str(missing), "--output", str(out)],
        "build": ["--coco-root", str(missing), "--output", str(out)],
        "publish": [str(missing), "--repo-id", "org/name", "--version", "v1.0.0"],
    }
    command = argv[:2] if argv[0] == "build" else argv[:1]
    line = _refused([*command, *needs[argv[0]], *argv[len(command) :]], capsys)
    assert says in line, line
    assert not out.exists()


def test_a_sweeps_seeds_out_of_range_are_refused_before_the_first_seed_runs(tmp_path, capsys):
    out = tmp_path / "sweep"
    train = ["--", "--real", str(tmp_path / "no-such-build")]  # seed 1 would fail at its first model load
    line = _refused(["sweep", "--seeds", f"1,{2**32}", "--output", str(out), *train], capsys)
    assert f"--seeds 1,{2**32}: every seed must be between 0 and 4294967295" in line, line
    argv = ["sweep", "--seeds", "1-3", "--data-seed-offset", str(2**32 - 2), "--output", str(out)]
    line = _refused([*argv, *train], capsys)
    assert "--data-seed-offset 4294967294: every seed must be between 0 and 4294967295" in line, line
    assert not out.exists()
