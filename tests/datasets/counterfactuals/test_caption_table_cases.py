"""Hostile and odd `--captions-from` tables (issue #32): each case through the CLI, as a user
meets it. Encodings (a byte-order mark), ids (spaces, non-scalar JSON, huge integers, floats),
unparsable lines (every line bad, JSON nested 200,000 deep, a line of megabytes), captions too
long for the generator's text encoder, a dataset folder whose README points outside it, a
relative path naming the user's home, and a file name holding Markdown/HTML: each is a counted
skip under its own reason or one line naming the file and row; no output names a local path or
shows data text as Markdown/HTML."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path
from unittest import mock

import datasets
import pytest
from datasets import load_dataset
from markdown_it import MarkdownIt

from builders.app.cli import main as cli_main

from helpers.build_helpers import error_line, table_images_argv

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "1", "--candidate-batch", "1"]
GOOD = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach."),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch."),
]
JSONL_KEYS = ("coco-counterfactual-index", "original_caption", "counterfactual_caption")


def jsonl_line(row_id, caption_0: str = GOOD[0][1], caption_1: str = GOOD[0][2], **extra) -> str:
    return json.dumps({JSONL_KEYS[0]: row_id, JSONL_KEYS[1]: caption_0, JSONL_KEYS[2]: caption_1, **extra})


def good_jsonl() -> list[str]:
    return [jsonl_line(*row) for row in GOOD]


def good_tsv() -> list[str]:
    return ["\t".join(row) for row in GOOD]


def write(path: Path, lines: list[str], prefix: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(prefix + ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def build(out: Path, tiny: Path, captions_from: str, *extra: str, budget: bool = True) -> int:
    budget_args = ["--max-error-fraction", "1"] if budget else []
    argv = table_images_argv(captions_from, tiny, out, *IMAGE_ARGS, *budget_args, *extra)
    # sys.argv as the console script has it: the manifest records the command line.
    with mock.patch.object(sys, "argv", ["counterfactory", *argv]):
        return cli_main(argv)


def manifest(out: Path) -> dict:
    return json.loads((out / "build_manifest.json").read_text())


def row_ids(out: Path) -> list[str]:
    return load_dataset(str(out), split="test").remove_columns(["image_0", "image_1"])["id"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- encodings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, lines", [("pairs.tsv", ["id\tcaption_0\tcaption_1", *good_tsv()]), ("pairs.jsonl", good_jsonl()[:1])]
)
def test_a_byte_order_mark_is_no_part_of_the_first_line(tmp_path, tiny_models_dir, nltk_data_dir, name, lines):
    """Saved by a Windows editor: the BOM once made the TSV header a published row `\\ufeffid`,
    and a one-line JSONL a misleading 'has no key(s) ... (keys: [])'."""
    table = write(tmp_path / name, lines, prefix=b"\xef\xbb\xbf")
    out = tmp_path / "out"
    assert build(out, tiny_models_dir, str(table)) == 0
    assert row_ids(out) == [row[0] for row in GOOD][: len(lines) - name.endswith(".tsv")]
    assert manifest(out)["errors"] == {}


# -- ids -----------------------------------------------------------------------------------------


def test_ids_that_differ_only_in_surrounding_spaces_are_one_id(tmp_path, tiny_models_dir, capsys):
    table = write(
        tmp_path / "pairs.tsv",
        [f"7\t{GOOD[0][1]}\t{GOOD[0][2]}", f"8\t{GOOD[1][1]}\t{GOOD[1][2]}", f"7 \t{GOOD[1][1]}\t{GOOD[1][2]}"],
    )
    assert build(tmp_path / "out", tiny_models_dir, str(table)) == 2
    line = error_line(capsys)
    assert "pairs.tsv line 1 and pairs.tsv line 3 both have the id '7'" in line
    assert not (tmp_path / "out" / "build_manifest.json").exists()


def test_ids_that_are_no_string_or_integer_are_counted_bad_ids(tmp_path, tiny_models_dir, nltk_data_dir):
    """JSON objects, arrays and booleans were published as their Python repr (`{'a': 1}`), and a
    5,000-digit integer failed its line; a float's spelling is lost in parsing (7.0 == 7.00)."""
    bad = ['{"a": 1}', "[1, 2]", "true", "7.0", "1e3", "9" * 5000, json.dumps("x" * 300)]
    lines = [
        f'{{"{JSONL_KEYS[0]}": {raw}, "{JSONL_KEYS[1]}": "{GOOD[0][1]}", "{JSONL_KEYS[2]}": "{GOOD[0][2]}"}}'
        for raw in bad
    ]
    table = write(tmp_path / "pairs.jsonl", [*lines, *good_jsonl()])
    out = tmp_path / "out"
    assert build(out, tiny_models_dir, str(table)) == 0
    assert row_ids(out) == [row[0] for row in GOOD]
    assert manifest(out)["errors"] == {"bad_id": len(bad)}
    # Integers are ids, as their digits; strings without their surrounding spaces.
    table = write(tmp_path / "ints.jsonl", [jsonl_line(17), jsonl_line(" 18 ", *GOOD[1][1:])])
    assert build(tmp_path / "ints", tiny_models_dir, str(table)) == 0
    assert row_ids(tmp_path / "ints") == ["17", "18"]


# -- lines that are no row -----------------------------------------------------------------------


def test_a_jsonl_file_with_no_json_object_is_one_line(tmp_path, tiny_models_dir, capsys):
    """Every line failing once reported 'has no key(s) ... (keys: [])', as if keys were wrong."""
    table = write(tmp_path / "pairs.jsonl", ["{not json", "[1, 2]", "[" * 200_000 + "]" * 200_000])
    assert build(tmp_path / "out", tiny_models_dir, str(table)) == 2
    line = error_line(capsys)
    assert (
        "pairs.jsonl: has no line holding a JSON object (of 3 line(s); the first: pairs.jsonl line 1 is not JSON"
        in line
        and "has no key" not in line
    )


def test_a_tsv_file_with_no_row_is_one_line(tmp_path, tiny_models_dir, capsys):
    table = write(tmp_path / "pairs.tsv", ["id,caption_0,caption_1", "7,a dog,a cat"])
    assert build(tmp_path / "out", tiny_models_dir, str(table)) == 2
    assert (
        "pairs.tsv: has no line holding 3 tab-separated fields (of 2 line(s); the first: "
        "pairs.tsv line 1 has 1 tab-separated fields" in error_line(capsys)
    )


def test_a_huge_integer_id_alone_is_a_counted_bad_id(tmp_path, tiny_models_dir, capsys):
    """Python refuses to convert a 5,000-digit integer: the line once failed, and the file with
    it 'had no key(s)'. Now it is the row's bad id, counted against the error budget."""
    table = write(tmp_path / "pairs.jsonl", [jsonl_line(0).replace("0", "7" * 5000, 1)])
    assert build(tmp_path / "out", tiny_models_dir, str(table), budget=False) == 2
    line = error_line(capsys)
    assert "has no key" not in line and "bad_id" in line


def test_deep_json_and_huge_lines_are_counted_and_the_rest_built(tmp_path, tiny_models_dir, nltk_data_dir, capsys):
    """JSON nested 200,000 deep was a RecursionError traceback; a line of megabytes (an extra key
    of 2 MB here) was parsed whole, and a caption of thousands of characters went to NLTK and the
    tokenizers (a 10 MB one ran 15 minutes at 7.9 GB and logged 20 MB of warnings)."""
    words = " ".join(["a big red"] * 600)
    table = write(
        tmp_path / "pairs.jsonl",
        [
            "[" * 200_000 + "]" * 200_000,
            jsonl_line("deep", **{"notes": [[[1]]] * 2}),  # nested a little: fine
            jsonl_line("huge", notes="x" * (2 << 20)),
            jsonl_line("long", f"{words} dog.", f"{words} cat."),
            *good_jsonl(),
        ],
    )
    out = tmp_path / "out"
    assert build(out, tiny_models_dir, str(table)) == 0
    assert row_ids(out) == ["deep", *(row[0] for row in GOOD)]
    assert manifest(out)["errors"] == {"bad_row": 1, "row_too_long": 1, "caption_too_long": 1}
    assert "Traceback" not in capsys.readouterr().err


# -- the text encoder's view of the edit --------------------------------------------------------


def test_an_edit_the_text_encoder_cannot_see_draws_nothing(tmp_path, tiny_models_dir, nltk_data_dir):
    """A 120-word caption whose swapped word lies past the text encoder's 77 tokens gave two
    byte-identical images (directional similarity 0), published, or counted as failing CLIP
    under a threshold; so did a change of case, which CLIP's tokenizer lowercases away."""
    words = " ".join(["a small brown"] * 40)  # 120 words, far more than 77 tokens
    table = write(
        tmp_path / "pairs.tsv",
        [f"past\t{words} dog.\t{words} cat.", "case\tA Dog on a mat.\tA dog on a mat.", *good_tsv()],
    )
    out = tmp_path / "out"
    assert build(out, tiny_models_dir, str(table), "--directional-threshold", "-1") == 0
    found = manifest(out)
    assert row_ids(out) == [row[0] for row in GOOD]
    assert found["skipped"] == {"edit_beyond_text_encoder": 1, "edit_invisible_to_text_encoder": 1}
    # Found before generation: candidates were drawn for the two good pairs only.
    assert found["counts"]["image_candidates_tried"] == len(GOOD)


# -- dataset folders -----------------------------------------------------------------------------


def pairs_dataset(rows) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"id": [r[0] for r in rows], "caption_0": [r[1] for r in rows], "caption_1": [r[2] for r in rows]}
    )


def outside_folder(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A dataset folder (caption pairs, with a `caption` column for the captions stage) that
    reads a file outside it: through its README `configs:` or a symlink. (folder, outside file)"""
    secret = tmp_path / "private" / "secret.parquet"
    secret.parent.mkdir()
    pairs_dataset([("s1", "A secret dog.", "A secret cat.")]).add_column("caption", ["A secret dog."]).to_parquet(
        str(secret)
    )
    folder = tmp_path / "pairs"
    folder.mkdir()
    if how == "symlink":
        (folder / "train.parquet").symlink_to(secret)
    else:
        pairs_dataset(GOOD).add_column("caption", [r[1] for r in GOOD]).to_parquet(str(folder / "train.parquet"))
        path = "../private/secret.parquet" if how == "relative" else str(secret)
        (folder / "README.md").write_text(
            f"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: {path}\n---\n"
        )
    return folder, secret


OUTSIDE_COMMANDS = {
    "--captions-from": lambda src, tiny, out: [
        "build",
        "coco-counterfactuals",
        "--stage",
        "images",
        "--captions-from",
        str(src),
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny),
        "--output",
        str(out),
    ],
    "--dataset": lambda src, tiny, out: [
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
        "--tiny-models-dir",
        str(tiny),
        "--output",
        str(out),
    ],
    "eccv --dataset": lambda src, tiny, out: [
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


@pytest.mark.parametrize("how", ["relative", "absolute", "symlink"])
@pytest.mark.parametrize("command", list(OUTSIDE_COMMANDS))
def test_a_dataset_folder_never_reads_a_file_outside_it(tmp_path, tiny_models_dir, capsys, command, how):
    folder, secret = outside_folder(tmp_path, how)
    out = tmp_path / "out"
    assert cli_main(OUTSIDE_COMMANDS[command](folder, tiny_models_dir, out)) == 2
    line = error_line(capsys)
    assert f"{folder}: " in line
    assert (
        "train.parquet is a link to a file outside the folder"
        if how == "symlink"
        else f"its README `configs:` names the data file {secret}, outside the folder"
    ) in line
    assert not out.exists() or not any(
        "secret" in p.read_bytes().decode("latin-1") for p in out.rglob("*") if p.is_file()
    )


def test_a_dataset_folder_records_the_digest_of_each_file_read(tmp_path, tiny_models_dir, nltk_data_dir):
    """The digests are those of the files `datasets` read (here the README's `configs:` names
    one under data/), not of whatever data-like files lie in the folder."""
    folder = tmp_path / "pairs"
    (folder / "data").mkdir(parents=True)
    (folder / "other").mkdir()
    pairs_dataset(GOOD).to_parquet(str(folder / "data" / "pairs.parquet"))
    pairs_dataset(GOOD).to_parquet(str(folder / "other" / "unused.parquet"))
    (folder / "notes.csv").write_text("not,read\n")
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/pairs.parquet\n---\n"
    )
    out = tmp_path / "out"
    assert build(out, tiny_models_dir, str(folder)) == 0
    assert row_ids(out) == [row[0] for row in GOOD]
    files = manifest(out)["config"]["captions_table"]["files"]
    assert files == {"data/pairs.parquet": sha256(folder / "data" / "pairs.parquet")}


# -- what outputs say about the table ------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["--captions-from", "--captions-from="])
def test_a_relative_table_path_is_named_portably(tmp_path, tiny_models_dir, nltk_data_dir, spelling):
    """`--captions-from ../home/alice/pairs.tsv` was written as given into the card and manifest
    (config and command line). Now the table is `local:pairs.tsv@sha256:...` everywhere."""
    table = write(tmp_path / "home" / "alice" / "pairs.tsv", good_tsv())
    work = tmp_path / "work"
    work.mkdir()
    argv = [
        "build",
        "coco-counterfactuals",
        "--stage",
        "images",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--output",
        "out",
        *IMAGE_ARGS,
    ]
    argv[4:4] = (
        [spelling + "../home/alice/pairs.tsv"] if spelling.endswith("=") else [spelling, "../home/alice/pairs.tsv"]
    )
    with contextlib.chdir(work), mock.patch.object(sys, "argv", ["counterfactory", *argv]):
        assert cli_main(argv) == 0
    out = work / "out"
    recorded = manifest(out)
    name = recorded["config"]["captions_table"]["path"]
    assert name.startswith("local:pairs.tsv@sha256:")
    assert recorded["config"]["captions_from"] == name
    assert any(arg.endswith(name) for arg in recorded["command"])
    files = [p for p in out.rglob("*") if p.is_file() and ".parts" not in p.parts]
    assert files and not [p for p in files if "alice" in p.read_bytes().decode("latin-1")]
    assert table.exists()


def test_a_file_name_is_never_markdown_or_html_in_the_card(tmp_path, tiny_models_dir, nltk_data_dir):
    """A file name holding a backtick, HTML and a pipe went raw into the card three times (the
    table, its digest row, the command line), breaking out of its code spans."""
    name = "x`<img src=x onerror=alert(1)>`|*y*.tsv"
    table = write(tmp_path / name, good_tsv())
    out = tmp_path / "out"
    assert build(out, tiny_models_dir, str(table)) == 0
    html = MarkdownIt("commonmark").enable("table").render((out / "README.md").read_text())
    assert "<img src=x" not in html and "<em>y</em>" not in html
    shown = "x`&lt;img src=x onerror=alert(1)&gt;`|*y*.tsv"
    assert html.count(shown) == 3, html  # in <code>, pipes included: cells were not split
