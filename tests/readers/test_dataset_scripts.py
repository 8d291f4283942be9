"""A dataset folder holding a loading script (`NAME/NAME.py`, the layout `datasets` no longer
runs) given to any reader of user datasets (the builders, `counterfactory show`, the trainer):
one line naming the folder and the fix, exit 2, no traceback (issue #21)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from builders.app.cli import main as cli_main
from builders.engine.errors import InputFileError


def script_dataset(tmp_path: Path) -> Path:
    import datasets

    folder = tmp_path / "captions"
    folder.mkdir()
    datasets.Dataset.from_dict({"caption": ["a dog on a sofa", "a cat on a mat"]}).to_parquet(
        str(folder / "train.parquet")
    )
    (folder / "captions.py").write_text(
        "import datasets\n\n\nclass Captions(datasets.GeneratorBasedBuilder):\n    pass\n"
    )
    return folder


COMMANDS = {
    "counterfactuals --dataset": lambda src, out: [
        "build",
        "coco-counterfactuals",
        "--stage",
        "captions",
        "--dataset",
        str(src),
        "--text-column",
        "caption",
        "--models",
        "tiny",
        "--output",
        str(out),
    ],
    "counterfactuals --captions-from": lambda src, out: [
        "build",
        "coco-counterfactuals",
        "--stage",
        "images",
        "--captions-from",
        str(src),
        "--models",
        "tiny",
        "--output",
        str(out),
    ],
    "eccv candidates --dataset": lambda src, out: [
        "eccv",
        "candidates",
        "--dataset",
        str(src),
        "--dataset-split",
        "train",
        "--text-column",
        "caption",
        "--model",
        "tiny",
        "--output",
        str(out / "c.json"),
    ],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_dataset_folder_with_a_loading_script_is_one_line(tmp_path, command, capsys):
    source = script_dataset(tmp_path)
    assert cli_main(COMMANDS[command](source, tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("counterfactory: error:")]
    assert len(lines) == 1, err
    flag = command.split()[-1]
    assert f"{source}: holds the loading script captions.py" in lines[0]
    assert f"give {flag} a folder of data files" in lines[0]


def image_dataset_with_script(folder: Path) -> Path:
    """A build-shaped folder (README `configs:`, one parquet shard with an image column) that
    also holds `NAME.py`."""
    import datasets

    from PIL import Image

    features = datasets.Features(
        {
            "image": datasets.Image(),
            "image_id": datasets.Value("int64"),
            "caption_ids": datasets.List(datasets.Value("int64")),
            "captions": datasets.List(datasets.Value("string")),
        }
    )
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_dict(
        {
            "image": [Image.new("RGB", (8, 8), (200, 20, 20))],
            "image_id": [1],
            "caption_ids": [[1]],
            "captions": [["a red square"]],
        },
        features=features,
    ).to_parquet(str(folder / "data" / "train-00000-of-00001.parquet"))
    meta = {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*.parquet"}]}],
        "dataset_info": [{"config_name": "default", "features": features._to_yaml_list()}],
    }
    (folder / "README.md").write_text(f"---\n{yaml.safe_dump(meta)}---\n# a build\n")
    (folder / f"{folder.name}.py").write_text("import datasets\n")
    return folder


def test_show_on_a_folder_with_a_loading_script_is_one_line(tmp_path, capsys):
    build = image_dataset_with_script(tmp_path / "shown")
    assert cli_main(["show", str(build), "--output", str(tmp_path / "gallery")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("counterfactory: error:")]
    assert len(lines) == 1, err
    assert f"{build}: holds the loading script shown.py" in lines[0]
    assert "give `show` a folder of data files" in lines[0]


def test_a_trainer_source_with_a_loading_script_is_one_line(tmp_path):
    from training.config import DataConfig, SourceRef
    from training.mixtures import build_mixture

    real = image_dataset_with_script(tmp_path / "real")
    with pytest.raises(InputFileError) as raised:
        build_mixture(DataConfig(real=SourceRef(str(real)), real_train_splits=("train",)))
    message = str(raised.value)
    assert "\n" not in message
    assert f"{real}: holds the loading script real.py" in message
    assert "give --real / --decorrelation / --counterfactuals a folder of data files" in message
