"""Manifests name paths portably: inside the build → relative, Hub cache → ORG/NAME@REV, other
local files and folders → `local:NAME@sha256:...` of their contents; URLs and prose untouched."""

from __future__ import annotations

from builders.infra.provenance import content_digest, portable


def test_portable_names(tmp_path):
    build = tmp_path / "out" / "build"
    (build / "data").mkdir(parents=True)
    model = tmp_path / "models" / "clip"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"hidden": 8}')
    snapshot = tmp_path / "hub" / "models--openai--clip-vit-base-patch32" / "snapshots" / "0123abcd"
    manifest = {
        "output": str(build), "shard": str(build / "data"),
        "models": {"clip": str(model), "open_clip": f"local-dir:{model}", "hub": str(snapshot),
                   "real": "openai/clip-vit-base-patch32"},
        "command": ["counterfactory", f"--coco-root={model}", "--steps", "2"],
        "endpoint": "http://127.0.0.1:8765/api", "prose": "written to /tmp by default",
    }
    out = portable(manifest, build)
    digest = content_digest(model)[:16]
    assert out["output"] == "." and out["shard"] == "data"
    assert out["models"] == {"clip": f"local:clip@sha256:{digest}",
                             "open_clip": f"local-dir:local:clip@sha256:{digest}",
                             "hub": "openai/clip-vit-base-patch32@0123abcd",
                             "real": "openai/clip-vit-base-patch32"}
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
    manifest = {"models": {"sd_inpaint": str(model)},
                "card_fields": {"method": [f"inpainting with `{model}` (2 steps)"]}}
    out = portable(manifest, tmp_path / "build")
    name = out["models"]["sd_inpaint"]
    assert name.startswith("local:sd_inpaint@sha256:")
    assert out["card_fields"]["method"] == [f"inpainting with `{name}` (2 steps)"]
