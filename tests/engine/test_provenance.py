"""Manifests name paths portably: inside the build → relative, Hub cache → ORG/NAME@REV, other
local files and folders → `local:NAME@sha256:...` of their contents; URLs and prose untouched.
A model is named by what its spec resolves to, however it is spelled; a Hub id stays a Hub id."""

from __future__ import annotations

import os

import pytest

from builders.engine.provenance import content_digest, model_name, portable


def test_portable_names(tmp_path):
    build = tmp_path / "out" / "build"
    (build / "data").mkdir(parents=True)
    model = tmp_path / "models" / "clip"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"hidden": 8}')
    snapshot = tmp_path / "hub" / "models--openai--clip-vit-base-patch32" / "snapshots" / "0123abcd"
    manifest = {
        "output": str(build),
        "shard": str(build / "data"),
        "models": {
            "clip": str(model),
            "open_clip": f"local-dir:{model}",
            "hub": str(snapshot),
            "real": "openai/clip-vit-base-patch32",
        },
        "command": ["counterfactory", f"--coco-root={model}", "--steps", "2"],
        "endpoint": "http://127.0.0.1:8765/api",
        "prose": "written to /tmp by default",
    }
    out = portable(manifest, build)
    digest = content_digest(model)[:16]
    assert out["output"] == "." and out["shard"] == "data"
    assert out["models"] == {
        "clip": f"local:clip@sha256:{digest}",
        "open_clip": f"local:clip@sha256:{digest}",
        "hub": "openai/clip-vit-base-patch32@0123abcd",
        "real": "openai/clip-vit-base-patch32",
    }
    assert out["command"] == ["counterfactory", f"--coco-root=local:clip@sha256:{digest}", "--steps", "2"]
    assert out["endpoint"] == manifest["endpoint"] and out["prose"] == manifest["prose"]
    assert str(tmp_path) not in str(out)


def test_folder_digest_follows_contents(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    before = content_digest(tmp_path)
    (tmp_path / "config.json").write_text('{"changed": 1}')
    assert content_digest(tmp_path) != before
    changed_config = content_digest(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 11)  # big files enter by size
    assert content_digest(tmp_path) != changed_config


def test_prose_quoting_a_path_gets_the_same_name(tmp_path):
    model = tmp_path / "tiny" / "sd_inpaint"
    model.mkdir(parents=True)
    manifest = {
        "models": {"sd_inpaint": str(model)},
        "card_fields": {"method": [f"inpainting with `{model}` (2 steps)"]},
    }
    out = portable(manifest, tmp_path / "build")
    name = out["models"]["sd_inpaint"]
    assert name.startswith("local:sd_inpaint@sha256:")
    assert out["card_fields"]["method"] == [f"inpainting with `{name}` (2 steps)"]


@pytest.fixture
def model_folder(tmp_path, monkeypatch):
    """A local model folder `models/sd` under the working folder (so relative spellings work)."""
    folder = tmp_path / "work" / "models" / "sd"
    folder.mkdir(parents=True)
    (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    (folder / "unet.safetensors").write_bytes(b"\0" * 64)
    monkeypatch.chdir(tmp_path / "work")
    return folder


def test_a_local_model_is_named_by_its_contents_however_spelled(model_folder, tmp_path):
    name = f"local:sd@sha256:{content_digest(model_folder)[:16]}"
    (tmp_path / "link").symlink_to(model_folder)
    spellings = [
        str(model_folder),
        "models/sd",
        "./models/sd",
        "models/sd/",
        "models/../models/sd",
        f"local-dir:{model_folder}",
        "local-dir:models/sd",
        "hf-hub:models/sd",
        str(tmp_path / "link"),
    ]
    assert {s: model_name(s) for s in spellings} == dict.fromkeys(spellings, name)
    os.chdir(model_folder)
    assert model_name(".") == name
    # A path-like spec that does not exist is still local: never passed off as a Hub id.
    assert model_name("./gone/sd-old") == model_name("/nowhere/sd-old") == "local:sd-old"


def test_hub_ids_stay_hub_ids_with_the_cached_revision(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.chdir(tmp_path)
    assert model_name("openai/clip-vit-base-patch32") == "openai/clip-vit-base-patch32"
    assert model_name("gpt2") == "gpt2"
    assert model_name("hf-hub:timm/vit_base_patch32_clip_224.openai") == "hf-hub:timm/vit_base_patch32_clip_224.openai"
    assert model_name("open_clip:ViT-B-32:openai") == "open_clip:ViT-B-32:openai"
    # A snapshot in the local Hub cache (as a download leaves it) tells the revision.
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = "counterfactory-test/cached-model"
    cached = os.path.join(huggingface_hub.constants.HF_HUB_CACHE, "models--counterfactory-test--cached-model")
    os.makedirs(os.path.join(cached, "snapshots", revision))
    os.makedirs(os.path.join(cached, "refs"))
    with open(os.path.join(cached, "refs", "main"), "w") as f:
        f.write(revision)
    assert model_name(repo) == f"{repo}@{revision}"
    assert model_name(f"hf-hub:{repo}") == f"hf-hub:{repo}@{revision}"
    assert model_name(os.path.join(cached, "snapshots", revision)) == f"{repo}@{revision}"
    # An open_clip checkpoint file given as the tag is a local file.
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    assert (
        model_name("open_clip:ViT-B-32:ckpt.pt")
        == f"open_clip:ViT-B-32:local:ckpt.pt@sha256:{content_digest(tmp_path / 'ckpt.pt')[:16]}"
    )


def test_relative_model_specs_are_named_in_values_commands_and_prose(model_folder, tmp_path):
    spec, other = "models/sd", "models/sd_v2"
    manifest = {
        "models": {"sd": spec, "hub": "openai/clip-vit-large-patch14"},
        "config": {"models": {"sd": spec}, "note": f"{other} is another folder"},
        "command": ["counterfactory", "--sd-model", spec, f"--sd-model={spec}"],
        "card_fields": {"method": [f"Stable Diffusion (`{spec}`, 2 steps); {spec}."]},
    }
    out = portable(manifest, tmp_path / "build", inputs=manifest["models"].values())
    name = model_name(spec)
    assert name.startswith("local:sd@sha256:")
    assert out["models"] == {"sd": name, "hub": "openai/clip-vit-large-patch14"}
    assert out["config"] == {"models": {"sd": name}, "note": f"{other} is another folder"}
    assert out["command"] == ["counterfactory", "--sd-model", name, f"--sd-model={name}"]
    assert out["card_fields"]["method"] == [f"Stable Diffusion (`{name}`, 2 steps); {name}."]
