"""A dataset folder holding a loading script (`NAME/NAME.py`, the layout `datasets` no longer
runs) given to any reader of user datasets: one line naming the folder and the fix, exit 2, no
traceback (issue #21)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.app.cli import main as cli_main


def script_dataset(tmp_path: Path) -> Path:
    import datasets

    folder = tmp_path / "captions"
    folder.mkdir()
    datasets.Dataset.from_dict({"caption": ["a dog on a sofa", "a cat on a mat"]}).to_parquet(
        str(folder / "train.parquet"))
    (folder / "captions.py").write_text("import datasets\n\n\n"
                                        "class Captions(datasets.GeneratorBasedBuilder):\n    pass\n")
    return folder


COMMANDS = {
    "counterfactuals --dataset": lambda src, out: [
        "build", "coco-counterfactuals", "--stage", "captions", "--dataset", str(src),
        "--text-column", "caption", "--models", "tiny", "--output", str(out)],
    "counterfactuals --captions-from": lambda src, out: [
        "build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(src),
        "--models", "tiny", "--output", str(out)],
    "eccv candidates --dataset": lambda src, out: [
        "eccv", "candidates", "--dataset", str(src), "--dataset-split", "train",
        "--text-column", "caption", "--model", "tiny", "--output", str(out / "c.json")],
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
