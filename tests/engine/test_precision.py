"""`--dtype` (builders/engine/precision.py) and the trainer's `--mixed-precision` check: the
resolution table per device (a device string stands in for a GPU), the one-line refusals, bf16
really reaching the models' forwards on the CPU, the resolved precision in the manifest and the
card, no resume across precisions, and `--dtype fp32` giving the shards the option's absence
gives."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.app.cli import main as cli_main
from builders.counterfactuals.builder import CocoCounterfactualsBuilder
from builders.counterfactuals.config import CocoCounterfactualsConfig, ImageStageConfig
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine.errors import UserFacingError
from builders.engine.precision import Precision, resolve_dtype
from builders.models.profiles import resolve_profile
from training.finetune_clip import main as train_main

from helpers.build_helpers import shard_digests
from helpers.training_helpers import write_color_set

IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "2", "--candidate-batch", "2"]


def _never_asked() -> bool:
    raise AssertionError("bf16 support is a GPU question; it must not be asked here")


@pytest.mark.parametrize(
    "requested, device, expected",
    [
        ("auto", "cpu", "fp32"),
        ("auto", "cuda", "fp16"),
        ("auto", "cuda:3", "fp16"),
        ("auto", "mps", "fp32"),
        ("fp32", "cuda:0", "fp32"),
        ("fp32", "cpu", "fp32"),
        ("fp16", "cuda:1", "fp16"),
        ("bf16", "cpu", "bf16"),
    ],
)
def test_resolution_table(requested, device, expected):
    assert resolve_dtype(requested, device, bf16_supported=_never_asked) == expected


def test_bf16_follows_the_gpu_and_fp16_is_refused_on_the_cpu():
    assert resolve_dtype("bf16", "cuda:0", bf16_supported=lambda: True) == "bf16"
    with pytest.raises(
        UserFacingError,
        match=r"^--dtype bf16: this GPU \(cuda:0\) has no native "
        r"bfloat16.*use --dtype fp16$",
    ):
        resolve_dtype("bf16", "cuda:0", bf16_supported=lambda: False)
    with pytest.raises(
        UserFacingError,
        match=r"^--dtype fp16 needs a GPU .*use --dtype fp32 or "
        r"--dtype bf16$",
    ):
        resolve_dtype("fp16", "cpu")
    # What the manifest records: the device type, so workers on cuda:0 and cuda:1 agree.
    assert Precision("cuda:1", "fp16").as_config() == {"device": "cuda", "dtype": "fp16"}


def _image_config(tiny: Path, stage: str = "images") -> CocoCounterfactualsConfig:
    profile = resolve_profile("tiny", tiny)
    return CocoCounterfactualsConfig(
        stage=stage,
        captions_from="unused" if stage == "images" else None,
        coco_root=None if stage == "images" else "unused",
        models={"sd": profile.sd, "clip_filter": profile.clip_filter},
        images=ImageStageConfig(
            candidates=2, candidate_batch=2, steps=2, image_size=64, filters=("text_image",), clip_threshold=-1
        ),
    )


def test_the_builder_resolves_auto_on_its_device(tiny_models_dir, monkeypatch):
    config = _image_config(tiny_models_dir)
    for device, dtype in (("cuda:0", "fp16"), ("cpu", "fp32")):
        assert CocoCounterfactualsBuilder(replace(config, device=device)).precision() == Precision(device, dtype)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the process has a GPU
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert CocoCounterfactualsBuilder(config).precision() == Precision("cuda:2", "fp16")
    # A captions-only build runs no image model: --dtype cannot matter (nor be refused).
    captions = _image_config(tiny_models_dir, stage="captions")
    assert CocoCounterfactualsBuilder(replace(captions, device="cpu", dtype="fp16")).precision().dtype == "fp32"


def _record_forwards(modules: dict[str, torch.nn.Module]) -> dict[str, set[torch.dtype]]:
    """Per module, the dtypes of its weights and of its floating-point input tensors at each
    forward (not scalars: the UNet's timestep stays float32, its embedding is cast inside)."""
    seen: dict[str, set[torch.dtype]] = {name: set() for name in modules}

    def hook(name):
        def record(module, args, kwargs):
            seen[name].add(next(module.parameters()).dtype)
            seen[name].update(
                t.dtype
                for t in [*args, *kwargs.values()]
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim
            )

        return record

    for name, module in modules.items():
        module.register_forward_pre_hook(hook(name), with_kwargs=True)
    return seen


@pytest.mark.e2e
def test_bf16_on_the_cpu_runs_every_image_stage_model_in_bf16(tiny_models_dir):
    stage = CocoCounterfactualsBuilder(
        replace(_image_config(tiny_models_dir), device="cpu", dtype="bf16")
    ).image_stage()
    pipe, clip = stage.pipe, stage.scorer.model
    seen = _record_forwards(
        {
            "unet": pipe.unet,
            "vae decoder": pipe.vae.decoder,
            "text encoder": pipe.text_encoder,
            "clip vision": clip.vision_model,
            "clip text": clip.text_model,
        }
    )
    selection = stage.run("r0", "a red cat on a table", "a red dog on a table")
    assert seen == {name: {torch.bfloat16} for name in seen}
    assert selection.pair is not None and np.asarray(selection.pair.image_0).dtype == np.uint8
    # Scores come back as float32 whatever the model ran in.
    assert stage.scorer.texts(["a cat"]).dtype == torch.float32


@pytest.mark.e2e
def test_inpainting_follows_the_builders_precision(tiny_models_dir):
    from PIL import Image

    from builders.decorrelation.config import FillConfig
    from builders.decorrelation.fill import ImageFiller

    model = resolve_profile("tiny", tiny_models_dir).sd_inpaint
    filler = ImageFiller(FillConfig(model=model, steps=1, image_size=64), Precision("cpu", "bf16"))
    image, mask = Image.new("RGB", (40, 40), "white"), np.zeros((40, 40), bool)
    mask[10:20, 10:20] = True
    filler.fill(image, mask, 0)  # loads the pipeline
    seen = _record_forwards({"unet": filler._pipe.unet})
    out = np.asarray(filler.fill(image, mask, 0))
    assert seen == {"unet": {torch.bfloat16}} and out.dtype == np.uint8
    assert (out[~mask] == 255).all()  # pixels outside the mask stay the source's


def _build(out: Path, coco: Path, tiny: Path, *extra: str) -> int:
    return cli_main(
        [
            "build",
            "coco-counterfactuals",
            "--coco-root",
            str(coco),
            "--models",
            "tiny",
            "--tiny-models-dir",
            str(tiny),
            "--output",
            str(out),
            "--max-captions",
            "2",
            *IMAGE_ARGS,
            *extra,
        ]
    )


@pytest.mark.e2e
def test_fp32_is_the_cpu_output_recorded_and_never_resumed_in_another_precision(
    tmp_path, tiny_models_dir, nltk_data_dir, capsys
):
    coco = write_coco_fixture(tmp_path / "coco", CocoFixtureConfig(n_images=2, release="2017"))
    omitted, fp32, bf16 = tmp_path / "omitted", tmp_path / "fp32", tmp_path / "bf16"
    assert _build(omitted, coco, tiny_models_dir) == 0
    assert _build(fp32, coco, tiny_models_dir, "--dtype", "fp32") == 0
    digests = shard_digests(fp32)
    assert any(k.startswith("data/test") or "default" in k for k in digests), digests
    assert shard_digests(omitted) == digests
    for out, dtype in ((omitted, "fp32"), (fp32, "fp32")):
        manifest = json.loads((out / "build_manifest.json").read_text())
        assert manifest["config"]["precision"] == {"device": "cpu", "dtype": dtype}
        assert f"Stable Diffusion and CLIP ran on cpu in {dtype}" in (out / "README.md").read_text()
    capsys.readouterr()

    # Parts in another precision are not mixed into this build: a resume with bf16 is refused.
    assert _build(fp32, coco, tiny_models_dir, "--dtype", "bf16") == 2
    assert "holds a build made with a different configuration" in capsys.readouterr().err
    assert shard_digests(fp32) == digests
    assert _build(bf16, coco, tiny_models_dir, "--dtype", "bf16") == 0
    assert json.loads((bf16 / "build_manifest.json").read_text())["config"]["precision"] == {
        "device": "cpu",
        "dtype": "bf16",
    }
    assert "Stable Diffusion and CLIP ran on cpu in bf16" in (bf16 / "README.md").read_text()

    # fp16 on the CPU: one line naming the way out, nothing built.
    capsys.readouterr()
    assert _build(tmp_path / "fp16", coco, tiny_models_dir, "--dtype", "fp16") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--dtype fp16 needs a GPU" in err, err
    assert not (tmp_path / "fp16" / "data").exists()


def test_trainer_refuses_fp16_mixed_precision_on_the_cpu(tmp_path, tiny_models_dir, capsys):
    data = write_color_set(tmp_path / "colors", {"train": 2, "val": 1, "test": 1})
    out = tmp_path / "run"
    assert (
        train_main(
            [
                "--real",
                str(data),
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--mixed-precision",
                "fp16",
                "--num-workers",
                "0",
                "--output",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("counterfactory: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "--mixed-precision fp16 needs a GPU" in errors[0] and "--mixed-precision no" in errors[0]
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize(
    "fill, verify, dtype, expected, card",
    [
        ("inpaint", False, "auto", {"device": "cpu", "dtype": "fp32"}, "inpainting in fp32, the captioner"),
        ("inpaint", True, "bf16", {"device": "cpu", "dtype": "bf16"}, "inpainting and the removal check in bf16"),
        ("blur", True, "bf16", {"device": "cpu", "dtype": "bf16"}, "the removal check in bf16"),
        ("blur", False, "fp16", None, None),  # no model: nothing depends on the device (nor refused)
    ],
)
def test_decorrelation_records_the_precision_of_its_models(fill, verify, dtype, expected, card):
    from builders.decorrelation.builder import DecorrelationBuilder
    from builders.decorrelation.config import DecorrelationConfig, FillConfig, SourceConfig, VerifyConfig

    config = DecorrelationConfig(
        source=SourceConfig("coco", Path("coco")),
        fill=FillConfig(method=fill, model="some/inpainter"),
        verify=VerifyConfig(enabled=verify, model="some/clip"),
        dtype=dtype,
    )
    info = DecorrelationBuilder(config).info()
    assert info.config["precision"] == expected
    steps = [s for s in info.card_fields["how_built"] if s.startswith("Precision:")]
    assert len(steps) == (card is not None), steps
    assert all(s.startswith("Precision: models ran on cpu, ") and card in s for s in steps), steps
