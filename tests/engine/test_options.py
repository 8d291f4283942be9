"""Every option is declared once, as a typed config field (`builders.engine.options`): the
builders', the run's and the trainer's flags, their defaults, the `--models tiny` preset and
`--dtype` all come from the config classes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

import pytest

from builders.app.cli import build_parser
from builders.engine.options import (
    Preset,
    add_config_arguments,
    build_config,
    field_default,
    flag_of,
    given_values,
    is_option,
    option,
)
from builders.engine.sharding.run_config import BuildRunConfig


@dataclass
class _Stage:
    steps: int = option(100, "denoising steps (default %(default)s)")
    english_check: bool = option(True, "keep non-English captions", flag="--no-english-check")
    p_range: tuple[float, float] = option((0.1, 0.9), metavar=("LO", "HI"))
    filters: tuple[str, ...] = option(("a", "b"), choices=("a", "b", "c"))
    hidden: int = 3  # no option(): no flag


@dataclass
class _Config:
    root: str = option(help="where the source is")
    stage: _Stage = field(default_factory=_Stage)


def _parse(*argv: str, preset: Preset | None = None) -> tuple[argparse.ArgumentParser, _Config]:
    parser = argparse.ArgumentParser(prog="x")
    add_config_arguments(parser, _Config, groups={"stage": "stage"}, preset=preset)
    values = given_values(_Config, parser.parse_args(argv))
    return parser, build_config(_Config, preset.under(values) if preset else values)


def test_fields_become_flags_with_their_defaults_and_types():
    parser, config = _parse("--root", "r")
    assert config == _Config(root="r")
    _, config = _parse(
        "--root", "r", "--steps", "2", "--no-english-check", "--p-range", "0.2", "0.3", "--filters", "c"
    )
    assert config.stage == _Stage(steps=2, english_check=False, p_range=(0.2, 0.3), filters=("c",))
    text = parser.format_help()
    assert "denoising steps (default 100)" in text and "--p-range LO HI" in text
    assert "--hidden" not in text
    with pytest.raises(SystemExit):  # a field without a default is a required flag
        parser.parse_args([])


def test_a_preset_replaces_defaults_but_never_a_given_flag():
    tiny = Preset("--models tiny", _Config, {"stage": {"steps": 2}})
    parser, config = _parse("--root", "r", preset=tiny)
    assert config.stage.steps == 2
    assert _parse("--root", "r", "--steps", "100", preset=tiny)[1].stage.steps == 100
    assert "default 100 (2 with --models tiny)" in " ".join(parser.format_help().split())
    with pytest.raises(TypeError, match="no field 'step'"):  # a typo cannot drop out silently
        Preset("--models tiny", _Config, {"stage": {"step": 2}})


def test_a_value_filled_in_after_the_preset_never_reaches_the_preset():
    """A builder fills in defaults of its own on the merged values (coco-counterfactuals: the
    generator's reference guidance, by setdefault); the preset's section must be a copy, or the
    first build's generator would set every later build's guidance in the same process."""
    tiny = Preset("--models tiny", _Config, {"stage": {"steps": 2}})
    tiny.under({})["stage"]["p_range"] = (0.5, 0.5)
    tiny.under({"root": "r"})["stage"].setdefault("filters", ("c",))
    assert tiny.values == {"stage": {"steps": 2}}
    assert tiny.under({}) == {"stage": {"steps": 2}}


def test_run_flags_are_build_run_config_fields_with_its_defaults(tmp_path):
    from builders.launch import run_config_from_args

    args = build_parser().parse_args(["build", "coco-captions", "--coco-root", "c", "--output", str(tmp_path)])
    assert run_config_from_args(args) == BuildRunConfig(output_dir=tmp_path)
    args = build_parser().parse_args(
        ["build", "coco-captions", "--coco-root", "c", "--output", str(tmp_path), "--part-size", "8", "--overwrite"]
    )
    assert run_config_from_args(args) == BuildRunConfig(output_dir=tmp_path, part_size=8, overwrite=True)
    assert all(is_option(f) for f in fields(BuildRunConfig))


@pytest.mark.parametrize(
    "dataset,config_module",
    [
        ("coco-captions", "builders.coco_captions.config"),
        ("coco-counterfactuals", "builders.counterfactuals.config"),
        ("decorrelation", "builders.decorrelation.config"),
        ("eccv-positives", "builders.eccv_positives.config"),
    ],
)
def test_every_builder_flag_default_is_its_config_fields(dataset, config_module, capsys):
    """`--help` shows the field's default, wherever the help text names one."""
    import importlib

    from builders.engine.options import config_fields

    module = importlib.import_module(config_module)
    configs = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == config_module]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["build", dataset, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    flags = [(cls, f) for cls in configs for f, _ in config_fields(cls) if is_option(f)]
    assert flags, f"{config_module} declares no option() field"
    for _, f in flags:
        assert flag_of(f) in text
        if "%(default)s" in f.metadata["help"]:
            assert f"default {field_default(f)}" in text, flag_of(f)


def test_dtype_is_part_of_the_builders_configs(tiny_models_dir):
    from builders.counterfactuals import options as counterfactuals
    from builders.decorrelation import options as decorrelation

    for dataset, options in (("coco-counterfactuals", counterfactuals), ("decorrelation", decorrelation)):
        args = build_parser().parse_args(
            [
                "build",
                dataset,
                "--coco-root",
                "c",
                "--output",
                "o",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--dtype",
                "bf16",
            ]
        )
        assert options.config_from_args(args).dtype == "bf16"
