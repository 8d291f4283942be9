"""`counterfactory benchmark --model` tells the image-text families apart by config.json (#51):
a model of no accepted family is one line naming the id, the type found and the families
accepted, before any dataset is read; the tiny cross-encoders are what the papers score."""

from __future__ import annotations

import json

import pytest

from builders.app.cli import main as cli_main

FAMILY_HEADS = {
    "blip": "BlipForImageTextRetrieval",
    "bridgetower": "BridgeTowerForImageAndTextRetrieval",
    "vilt": "ViltForImageAndTextRetrieval",
    "flava": "FlavaForPreTraining",
}


def _bert(folder):
    from transformers import BertConfig, BertModel

    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    ).save_pretrained(folder)
    return folder


def _vit(folder):
    from transformers import ViTConfig, ViTModel

    ViTModel(
        ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32)
    ).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("build", "model_type", "arch"), [(_bert, "bert", "BertModel"), (_vit, "vit", "ViTModel")])
def test_a_model_of_no_family_is_one_line_before_any_dataset_is_read(tmp_path, capsys, build, model_type, arch):
    folder = build(tmp_path / model_type)
    capsys.readouterr()  # save_pretrained's progress
    missing = tmp_path / "no-such-build"  # read first, it would be the error
    argv = ["benchmark", "--model", str(folder), "--counterfactuals", str(missing), "--output", str(tmp_path / "o")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(folder) in err and f"'{model_type}'" in err and arch in err, err
    for family in ("CLIP", "BLIP", "BridgeTower", "ViLT", "FLAVA", *FAMILY_HEADS.values()):
        assert family in err, (family, err)
    assert str(missing) not in err and not (tmp_path / "o").exists()
    # The trainer parses --model with the same code: the same one line, before --real is read.
    from training.finetune_clip import main as train_main

    assert train_main(["--model", str(folder), "--real", str(missing), "--output", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err.strip() == err


def test_a_family_without_a_scored_head_is_one_line_naming_the_head_to_give(tmp_path, capsys, tiny_families_dir):
    """A BLIP captioner is BLIP but not its retrieval model: refused naming both."""
    import shutil

    folder = tmp_path / "blip-captioner"
    shutil.copytree(tiny_families_dir / "blip", folder)
    capsys.readouterr()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BlipForConditionalGeneration"]}))
    argv = ["benchmark", "--model", str(folder), "--counterfactuals", str(tmp_path / "x"), "--output", str(tmp_path)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BlipForConditionalGeneration" in err and "BlipForImageTextRetrieval" in err


def test_a_flava_head_that_scores_no_pair_is_refused_naming_the_heads(tmp_path, capsys, tiny_families_dir):
    """FlavaImageModel is FLAVA's image tower alone: no pair to score. Refused in one line naming
    FLAVA's scored heads. (FlavaModel and BridgeTowerForContrastiveLearning are scored:
    tests/training/test_benchmark_rerank.py.)"""
    import shutil

    for family, head, itm in (("flava", "FlavaImageModel", "FlavaForPreTraining"),):
        folder = tmp_path / head
        shutil.copytree(tiny_families_dir / family, folder)
        capsys.readouterr()
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": [head]}))
        argv = [
            "benchmark",
            "--model",
            str(folder),
            "--counterfactuals",
            str(tmp_path / "x"),
            "--output",
            str(tmp_path),
        ]
        assert cli_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and head in err and itm in err and "FlavaModel" in err, err


def test_the_tiny_families_are_tiny_safetensors_of_the_scored_heads(tiny_families_dir):
    """Each tiny family is its scored head, saved as safetensors only, hidden 32 wide (BridgeTower's
    vision tower: 64, its smallest), 2 layers and 32-pixel images, and it loads by its class."""
    import transformers

    for family, head in FAMILY_HEADS.items():
        folder = tiny_families_dir / family
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == family and config["architectures"] == [head]
        assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.bin"))
        model = getattr(transformers, head).from_pretrained(folder)
        assert sum(p.numel() for p in model.parameters()) < 2_000_000, family
        widths = {v for k, v in _walk(config) if k == "hidden_size"}
        assert widths <= {16, 32, 64}, (family, widths)
        assert {v for k, v in _walk(config) if k == "num_hidden_layers"} <= {2}, family
        assert {v for k, v in _walk(config) if k == "image_size"} == {32}, family
        # The captions of the test sets are words it knows: two captions differ in their ids.
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        red, blue = tok("a red cube")["input_ids"], tok("a blue cube")["input_ids"]
        assert red != blue and tok.unk_token_id not in red + blue, (family, red, blue)


def _walk(config: dict):
    for k, v in config.items():
        if isinstance(v, dict):
            yield from _walk(v)
        else:
            yield k, v
