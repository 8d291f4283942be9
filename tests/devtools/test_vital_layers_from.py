"""`build coco-counterfactuals --vital-layers-from JSON` given a hostile or foreign file (issue
#49): each is refused in one line naming the file before any build work starts (no output
folder is made), or, for provenance text, built with that text shown as plain text in the card.
The file is a real measurement of the tiny SD3 (`counterfactory doctor vital-layers`), edited."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from builders.app.cli import main as cli_main

HOSTILE = "<script>alert(1)</script>\n# Pwned <img src=x onerror=alert(1)>\n## Owned"


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_models_dir) -> dict:
    out = tmp_path_factory.mktemp("measured") / "sd3.json"
    argv = ["doctor", "vital-layers", "--generator", "sd3", "--models", "tiny", "--tiny-models-dir"]
    argv += [str(tiny_models_dir), "--prompts", "a red cat", "--steps", "2", "--top", "2", "--output", str(out)]
    assert cli_main(argv) == 0
    return json.loads(out.read_text())


def _build(tmp_path: Path, tiny: Path, data: dict | str, *extra: str) -> tuple[int, Path]:
    """The build of one caption pair on the tiny SD3 with `data` as its `--vital-layers-from`."""
    given = tmp_path / "vital.json"
    given.write_text(data if isinstance(data, str) else json.dumps(data))
    table = tmp_path / "pairs.tsv"
    table.write_text("9\tTwo dogs sleep on the couch.\tTwo cats sleep on the couch.\n")
    out = tmp_path / "out"
    argv = [
        *("build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(table)),
        *("--models", "tiny", "--tiny-models-dir", str(tiny), "--output", str(out)),
        *("--generator", "sd3", "--image-size", "64", "--steps", "2", "--candidates", "1"),
        *("--vital-layers-from", str(given), *extra),
    ]
    return cli_main(argv), out


@pytest.mark.e2e
def test_provenance_text_is_plain_text_in_the_card(measured, tmp_path, tiny_models_dir):
    data = json.loads(json.dumps(measured))
    data["provenance"].update(revision=HOSTILE, dino_model=HOSTILE)
    rc, out = _build(tmp_path, tiny_models_dir, data)
    assert rc == 0
    card = (out / "README.md").read_text()
    # Shown as written inside inline code (Markdown and HTML are not read there), on one line.
    assert card.count(f"`{HOSTILE.replace(chr(10), ' ')}`") == 2  # the DINOv2 model and the revision
    outside_code = re.sub(r"(`+)[^`].*?\1", "", card)
    assert "<script" not in outside_code and "<img" not in outside_code
    assert not [line for line in card.splitlines() if line.lstrip().startswith(("# Pwned", "## Owned"))]
