"""The gallery tests' shared helpers: tiny fixture builds (once per session), `counterfactory show`
and readers of what it wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

from datasets import load_dataset

from builders.app.cli import main as cli_main

#: Tiny builds shared by the gallery tests (built once per session, on demand).
BUILD_ARGS = {
    "coco-captions": lambda coco, tiny: ["--coco-root", str(coco), "--splits", "test", "val"],
    "coco-counterfactuals": lambda coco, tiny: [
        "--coco-root",
        str(coco),
        "--karpathy-splits",
        "test",
        "--max-captions",
        "12",
        "--candidates",
        "3",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny),
        # The tiny CLIP's random directional scores sit near 0: about half the candidates are
        # rejected, so rows carry rejections and some captions are skipped.
        "--directional-threshold",
        "0",
    ],
    "eccv-positives": lambda coco, tiny: ["--coco-root", str(coco), "--part-size", "8192"],
    "decorrelation": lambda coco, tiny: [
        "--coco-root",
        str(coco),
        "--max-images",
        "6",
        "--keep-original",
        "--products",
        "train",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny),
    ],
}


def fixture_build(name: str, root: Path, coco: Path, tiny: Path) -> Path:
    """`counterfactory build NAME` on the fixture into root/NAME, once per session."""
    out = root / "gallery_builds" / name
    if not (out / "build_manifest.json").exists():
        # A build's own --part-size (eccv-positives: 5,000 rows in one part, not 1,250) comes last.
        argv = ["build", name, "--part-size", "4", *BUILD_ARGS[name](coco, tiny), "--output", str(out)]
        assert cli_main(argv) == 0
    return out


def show(*argv: str) -> int:
    return cli_main(["show", *map(str, argv)])


def page_records(gallery: Path) -> list[dict]:
    """Every row record of the gallery's page scripts, in page order."""
    records = []
    for path in sorted((gallery / "pages").glob("page-*.js")):
        text = path.read_text(encoding="utf-8")
        payload = re.fullmatch(r"window\.galleryPage\((\d+), (.*)\);\n", text, flags=re.S)
        assert payload and int(payload.group(1)) == int(path.stem.split("-")[1]), path
        records += json.loads(payload.group(2))
    return records


def only_split(build: Path, config: str = "default"):
    splits = load_dataset(str(build), config)
    assert len(splits) == 1
    return next(iter(splits.values()))


def text_of(segs: list) -> str:
    return "".join(s[0] for s in segs)


def one_error_line(capsys, argv: list, *expected: str) -> str:
    capsys.readouterr()
    assert show(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("counterfactory: error: ") and "\n" not in err, err
    for part in expected:
        assert part in err, err
    return err
