"""The installed `counterfactory` command: every command and subcommand has working --help."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from builders.app.cli import build_parser, main

CLI = Path(sys.executable).parent / "counterfactory"


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from _subcommands(sub, prefix + (name,))


@pytest.mark.e2e
def test_help_lists_every_command():
    out = subprocess.run([str(CLI), "--help"], capture_output=True, text=True, check=True).stdout
    top = {path[0] for path in _subcommands(build_parser())}
    expected = {"fixture", "models", "nltk", "build", "publish", "publish-metric", "local-hub"}
    assert expected <= top
    for name in top:
        assert name in out


def test_every_command_has_help():
    paths = list(_subcommands(build_parser()))
    assert len(paths) > 7
    for path in paths:
        try:
            build_parser().parse_args([*path, "--help"])
        except SystemExit as stop:
            assert stop.code == 0, path
        else:  # pragma: no cover - argparse always exits on --help
            raise AssertionError(f"{path} --help did not exit")


# Option ranges are checked when the command line is parsed: argparse's usage error (exit 2),
# one line naming the option, before any input is read or model loaded.
BAD_OPTIONS = [
    (["--max-error-fraction", "-1"], "--max-error-fraction"),
    (["--max-error-fraction", "1.5"], "--max-error-fraction"),
    (["--max-error-fraction", "nan"], "--max-error-fraction"),
    (["--part-size", "0"], "--part-size"),
    (["--expect-processes", "0"], "--expect-processes"),
    (["--max-shard-bytes", "-5"], "--max-shard-bytes"),
]
PER_BUILDER = {
    "coco-captions": [(["--max-images", "0"], "--max-images"), (["--max-images", "-1"], "--max-images")],
    "decorrelation": [
        (["--max-images", "0"], "--max-images"),
        (["--alpha3", "1.2"], "--alpha3"),
        (["--inpaint-steps", "0"], "--inpaint-steps"),
        (["--mask-dilation", "-1"], "--mask-dilation"),
    ],
    "coco-counterfactuals": [
        (["--max-captions", "0"], "--max-captions"),
        (["--candidates", "0"], "--candidates"),
        (["--steps", "-2"], "--steps"),
        (["--image-size", "x"], "--image-size"),
    ],
}


def _bad_option_cases():
    for builder, cases in PER_BUILDER.items():
        for argv, option in [*BAD_OPTIONS, *cases]:
            yield pytest.param(builder, argv, option, id=f"{builder} {' '.join(argv)}")


@pytest.mark.parametrize("builder,argv,option", list(_bad_option_cases()))
def test_option_ranges_are_checked_at_parse_time(builder, argv, option, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["build", builder, "--coco-root", str(tmp_path / "missing"), "--output", str(tmp_path / "out"), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}" in err and argv[-1] in err, err
    assert not (tmp_path / "out").exists()


def test_tiny_profile_picks_small_sizes_and_flags_win(tiny_models_dir):
    from builders.counterfactuals import options as counterfactuals
    from builders.decorrelation import options as decorrelation

    def config(dataset, options, *argv):
        args = build_parser().parse_args(
            ["build", dataset, "--coco-root", "c", "--output", "o", "--tiny-models-dir", str(tiny_models_dir), *argv]
        )
        return options.config_from_args(args)

    production = config("coco-counterfactuals", counterfactuals).images
    tiny = config("coco-counterfactuals", counterfactuals, "--models", "tiny").images
    assert (production.steps, production.image_size, production.candidates) == (100, 512, 100)
    assert (tiny.steps, tiny.image_size, tiny.candidates) == (2, 64, 4)
    assert tiny.clip_threshold == -1.0 < production.clip_threshold
    # An explicit flag wins, even when it equals the production default.
    chosen = config(
        "coco-counterfactuals", counterfactuals, "--models", "tiny", "--steps", "100", "--image-size", "128"
    ).images
    assert (chosen.steps, chosen.image_size, chosen.candidates) == (100, 128, 4)
    decor = config("decorrelation", decorrelation, "--models", "tiny").fill
    assert (decor.image_size, decor.steps) == (64, 2)
    assert config("decorrelation", decorrelation, "--models", "tiny", "--inpaint-steps", "50").fill.steps == 50


@pytest.mark.e2e
def test_dataset_without_the_split_lists_configs_splits_and_flags(tmp_path):
    import datasets

    source = tmp_path / "captions_only"
    datasets.Dataset.from_dict({"caption": ["A dog on a couch.", "Two cats on a bed."]}).to_parquet(
        str(source / "data" / "validation-00000-of-00001.parquet")
    )
    proc = subprocess.run(
        [
            str(CLI),
            "build",
            "coco-counterfactuals",
            "--stage",
            "captions",
            "--dataset",
            str(source),
            "--text-column",
            "caption",
            "--output",
            str(tmp_path / "out"),
            "--models",
            "tiny",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("counterfactory: error:") and str(source) in line
    for expected in ("'train'", "default: validation", "--dataset-config", "--dataset-split"):
        assert expected in line, line
