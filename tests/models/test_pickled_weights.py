"""Model weights stored as pickles (`pytorch_model.bin`, `open_clip_pytorch_model.bin`, a
diffusers pipeline's `*.bin`) are refused in one line naming the file and
`--trust-pickled-weights`, by a build, the trainer and the benchmark, before any library opens
them (#32); with the flag they load, still with torch's weights_only loading, so a `__reduce__`
payload (which would create a marker file) never runs. The tiny models are safetensors only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from builders.app.cli import main as cli_main
from training.finetune_clip import main as train_main

from helpers.build_helpers import error_line
from helpers.decorrelation_fixtures import build_args
from helpers.training_helpers import write_color_set

#: The pickle name each library looks for in place of its safetensors file.
PICKLE_NAMES = {
    "model.safetensors": "pytorch_model.bin",
    "diffusion_pytorch_model.safetensors": "diffusion_pytorch_model.bin",
    "open_clip_model.safetensors": "open_clip_pytorch_model.bin",
}


class Payload:
    """Unpickling this creates `marker`: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def pickled_copy(model: Path, dst: Path, marker: Path | None = None) -> Path:
    """`model` with each safetensors weight file replaced by the pickle of the same weights (as
    older save_pretrained / torch.save wrote them), carrying a payload when `marker` is given."""
    shutil.copytree(model, dst)
    for weights in sorted(dst.rglob("*.safetensors")):
        state = dict(load_file(str(weights)))
        if marker is not None:
            state["payload"] = Payload(marker)
        torch.save(state, weights.with_name(PICKLE_NAMES[weights.name]))
        weights.unlink()
    return dst


def assert_payload_is_live(folder: Path, marker: Path) -> None:
    """Unpickled without weights_only, the planted file does run code: the test could fail."""
    torch.load(next(folder.rglob("*.bin")), weights_only=False)
    assert marker.exists()


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return write_color_set(tmp_path_factory.mktemp("colors") / "colors", {"train": 2, "test": 1})


def test_the_tiny_models_are_safetensors_only(tiny_models_dir):
    """Tests and the demo run the tiny profile without --trust-pickled-weights."""
    files = [p for p in tiny_models_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files)
    assert not [p for p in files if p.suffix in {".bin", ".pt", ".pth", ".ckpt", ".pkl"}]


@pytest.mark.parametrize("trust", [False, True])
def test_a_build_refuses_a_pickled_inpainting_model(
    coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path, capsys, trust
):
    """`build decorrelation --sd-inpaint-model` a diffusers folder whose weights are pickles with
    a payload: without the flag refused by file name; with it, torch's weights_only refuses the
    payload. Never run either way."""
    marker = tmp_path / "payload-ran"
    model = pickled_copy(tiny_models_dir / "sd_inpaint", tmp_path / "sd_inpaint", marker)
    out = tmp_path / "out"
    argv = [
        "build",
        "decorrelation",
        *build_args(coco_fixture_dir, out, tiny_models_dir),
        "--products",
        "train",
        "--caption",
        "prompts",
        "--sd-inpaint-model",
        str(model),
        *(["--trust-pickled-weights"] if trust else []),
    ]
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = error_line(capsys)
    if trust:
        assert str(model) in err and "weights_only" in err and "none of it ran" in err
    else:
        assert f"{model}/" in err and ".bin" in err and "--trust-pickled-weights" in err
    assert not marker.exists()
    assert_payload_is_live(model, marker)


@pytest.mark.parametrize(
    "backend, tiny, pickle_name",
    [("transformers", "clip", "pytorch_model.bin"), ("open_clip", "open_clip", "open_clip_pytorch_model.bin")],
)
def test_the_trainer_refuses_a_pickled_model(colors, tiny_models_dir, tmp_path, capsys, backend, tiny, pickle_name):
    marker = tmp_path / "payload-ran"
    model = pickled_copy(tiny_models_dir / tiny, tmp_path / "model", marker)
    out = tmp_path / "run"
    capsys.readouterr()
    assert (
        train_main(
            [
                "--real",
                str(colors),
                "--eval-only",
                "--backend",
                backend,
                "--model",
                str(model),
                "--report-to",
                "none",
                "--num-workers",
                "0",
                "--output",
                str(out),
            ]
        )
        == 2
    )
    err = error_line(capsys)
    assert str(model / pickle_name) in err and "--trust-pickled-weights" in err
    assert not marker.exists() and not (out / "run.json").exists()
    assert_payload_is_live(model, marker)


def test_trusted_pickled_weights_load_weights_only(colors, tiny_models_dir, tmp_path, capsys):
    """With --trust-pickled-weights a plain pickled model trains and evaluates; a payload in
    the same place is still refused in one line and never runs."""
    plain = pickled_copy(tiny_models_dir / "clip", tmp_path / "plain")
    common = [
        "--real",
        str(colors),
        "--eval-only",
        "--report-to",
        "none",
        "--num-workers",
        "0",
        "--trust-pickled-weights",
    ]
    assert train_main([*common, "--model", str(plain), "--output", str(tmp_path / "plain-run")]) == 0
    assert (tmp_path / "plain-run" / "run.json").is_file()
    marker = tmp_path / "payload-ran"
    hostile = pickled_copy(tiny_models_dir / "clip", tmp_path / "hostile", marker)
    capsys.readouterr()
    assert train_main([*common, "--model", str(hostile), "--output", str(tmp_path / "hostile-run")]) == 2
    err = error_line(capsys)
    assert str(hostile) in err and "weights_only" in err and "none of it ran" in err
    assert not marker.exists()


def test_the_benchmark_refuses_a_pickled_model(colors, tiny_models_dir, tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    model = pickled_copy(tiny_models_dir / "clip", tmp_path / "model", marker)
    capsys.readouterr()
    assert (
        cli_main(["benchmark", "--model", str(model), "--coco", str(colors), "--output", str(tmp_path / "report")])
        == 2
    )
    err = error_line(capsys)
    assert str(model / "pytorch_model.bin") in err and "--trust-pickled-weights" in err
    assert not marker.exists() and not (tmp_path / "report" / "results.jsonl").exists()


@pytest.mark.parametrize("trust", [False, True])
def test_eccv_candidates_refuse_a_pickled_annotator(coco_fixture_dir, tiny_models_dir, tmp_path, capsys, trust):
    """The machine-in-the-loop annotators load through the same loaders: refused by file name
    without the flag, and with it torch's weights_only refuses the payload; never run."""
    marker = tmp_path / "payload-ran"
    model = pickled_copy(tiny_models_dir / "clip", tmp_path / "clip", marker)
    out = tmp_path / "candidates.json"
    capsys.readouterr()
    assert (
        cli_main(
            [
                "eccv",
                "candidates",
                "--coco-root",
                str(coco_fixture_dir),
                "--image-queries",
                "2",
                "--caption-queries",
                "2",
                "--model",
                str(model),
                "--output",
                str(out),
                *(["--trust-pickled-weights"] if trust else []),
            ]
        )
        == 2
    )
    err = error_line(capsys)
    if trust:
        assert str(model) in err and "weights_only" in err
    else:
        assert str(model / "pytorch_model.bin") in err and "--trust-pickled-weights" in err
    assert not marker.exists() and not out.exists()
