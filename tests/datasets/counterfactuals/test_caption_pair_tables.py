"""The image stage takes any caption-pair table (`--captions-from`): the published
COCO-Counterfactuals `.tsv` (with or without a header) and `.jsonl` formats, a `datasets` folder
and a Hub dataset (the local Hub). Bad rows are counted with their reasons, the table's ids are the
row ids, and the table's provenance (path or repo + commit, sha256 per file) is in the manifest and
the card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets
import pytest
from datasets import load_dataset
from huggingface_hub import HfApi

from builders.app.cli import main as cli_main
from builders.counterfactuals.config import CocoCounterfactualsConfig
from builders.counterfactuals.pair_tables import read_pairs, resolve_table
from builders.engine.errors import UserFacingError

from helpers.build_helpers import table_images_argv

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "1", "--candidate-batch", "1"]

#: (id, caption_0, caption_1, expected reason or None: a good row). Ids are not in order and are
#: not row indices, so a build that renumbered rows would show.
ROWS = [
    ("A17", "A man riding a horse on a beach.", "A man riding a cow on a beach.", None),
    ("9", "Two dogs sleep on the couch.", "Two cats sleep on the couch.", None),
    ("x3", "A cat on a mat.", "A cat on a mat.", "identical_captions"),
    ("x4", "A red car next to a tree.", "A blue truck next to a tree.", "not_one_word_edit"),
    ("x5", "A bowl of fruit.", "A big bowl of fruit.", "not_one_word_edit"),
    ("x6", "   ", "A plate of food.", "blank_caption"),
]
GOOD = {r[0]: r for r in ROWS if r[3] is None}
BY_ID = {r[0]: r for r in ROWS}
MULTIWORD = {r[0] for r in ROWS if r[3] == "not_one_word_edit"}


def expected_problems(extra: dict[str, int] | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in ROWS:
        if r[3]:
            out[r[3]] = out.get(r[3], 0) + 1
    for k, v in (extra or {}).items():
        out[k] = out.get(k, 0) + v
    return out


def write_tsv(path: Path, header: bool) -> Path:
    lines = ["id\tcaption_0\tcaption_1"] if header else []
    lines += ["\t".join(r[:3]) for r in ROWS] + ["only\ttwo fields"]  # a malformed line
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path) -> Path:
    lines = [
        json.dumps(
            {
                "coco-counterfactual-index": i,
                "original_caption": c0,
                "counterfactual_caption": c1,
                "image_0": "/etc/passwd",
            }
        )
        for i, c0, c1, _ in ROWS
    ]
    lines += ["{not json", json.dumps({"original_caption": "A dog.", "counterfactual_caption": "A cat."})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pair_dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"pair_id": [r[0] for r in ROWS], "caption_0": [r[1] for r in ROWS], "caption_1": [r[2] for r in ROWS]}
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(captions_from: str, **options) -> tuple[dict, dict[str, list]]:
    """(provenance, {reason or "ok": [ids]}) of a table read as the image stage reads it."""
    cfg = CocoCounterfactualsConfig(stage="images", captions_from=captions_from, **options)
    table = resolve_table(cfg)
    out: dict[str, list] = {}
    for item in read_pairs(cfg, table):
        reason = item.input_problem.reason if item.input_problem else "ok"
        out.setdefault(reason, []).append(item.id)
        if reason == "ok" and item.id in BY_ID:  # (row-index ids name other rows)
            assert (item.row["caption_0"], item.row["caption_1"]) == BY_ID[item.id][1:3]
    return table.provenance, out


@pytest.mark.parametrize("header", [True, False])
def test_tsv_with_or_without_header(tmp_path, header):
    path = write_tsv(tmp_path / "pairs.tsv", header)
    provenance, found = read(str(path))
    assert found.pop("ok") == list(GOOD)
    assert found.pop("bad_row") == [None]
    assert {k: len(v) for k, v in found.items()} == expected_problems()
    assert provenance == {"format": "tsv", "path": str(path.resolve()), "files": {"pairs.tsv": sha256(path)}}
    # Multi-word edits only on request; identical and blank captions never.
    _, found = read(str(path), allow_multiword_edits=True)
    assert set(found["ok"]) == set(GOOD) | MULTIWORD and "not_one_word_edit" not in found


def test_jsonl_published_keys_and_column_options(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl")
    provenance, found = read(str(path))
    assert found.pop("ok") == list(GOOD)
    assert found.pop("bad_row") == [None] and found.pop("missing_id") == [None]
    assert {k: len(v) for k, v in found.items()} == expected_problems()
    assert provenance["files"] == {"pairs.jsonl": sha256(path)}
    # Other key names through the column options; a key on no line is one clear error.
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(json.dumps({"k": "A17", "a": ROWS[0][1], "b": ROWS[0][2]}) + "\n")
    assert read(str(renamed), id_column="k", caption_0_column="a", caption_1_column="b")[1] == {"ok": ["A17"]}
    with pytest.raises(UserFacingError, match="no key.*original_caption.*--caption-0-column"):
        read(str(renamed))


def test_datasets_folder_keeps_ids(tmp_path):
    folder = tmp_path / "pairs"
    folder.mkdir()
    pair_dataset().to_parquet(str(folder / "train.parquet"))
    provenance, found = read(str(folder), id_column="pair_id")
    assert found.pop("ok") == list(GOOD)
    assert {k: len(v) for k, v in found.items()} == expected_problems()
    assert provenance["files"] == {"train.parquet": sha256(folder / "train.parquet")}
    # Without an id column the row index is the id.
    assert read(str(folder))[1]["ok"] == ["0", "1"]
    with pytest.raises(UserFacingError, match="no column.*'nope'.*--id-column"):
        read(str(folder), id_column="nope")


def test_unknown_table_is_one_line(tmp_path):
    with pytest.raises(UserFacingError, match="no file or folder here and no readable Hub dataset"):
        read("nobody/no-such-pairs")
    (tmp_path / "pairs.csv").write_text("id,caption_0,caption_1\n")
    with pytest.raises(UserFacingError, match="neither a .tsv nor a .jsonl"):
        read(str(tmp_path / "pairs.csv"))


def build(out: Path, tiny: Path, captions_from: str, *extra: str) -> dict:
    argv = table_images_argv(captions_from, tiny, out, "--max-error-fraction", "1", *IMAGE_ARGS, *extra)
    assert cli_main(argv) == 0
    return json.loads((out / "build_manifest.json").read_text())


def check_build(out: Path, manifest: dict, extra_errors: dict[str, int]) -> list[dict]:
    rows = load_dataset(str(out), split="test").remove_columns(["image_0", "image_1"]).to_list()
    assert [r["id"] for r in rows] == list(GOOD)
    for r in rows:
        assert (r["caption_0"], r["caption_1"]) == GOOD[r["id"]][1:3] and r["source_id"] == r["id"]
        # The swapped word, located as in the captions build (schema: replaced_position).
        c0, c1, at = r["caption_0"], r["caption_1"], r["replaced_position"]
        assert c0[at : at + len(r["replaced_word"])] == r["replaced_word"]
        assert c1[at : at + len(r["replacement_word"])] == r["replacement_word"]
    assert manifest["errors"] == expected_problems(extra_errors)
    return rows


def test_image_stage_builds_from_tsv_and_jsonl(tmp_path, tiny_models_dir, nltk_data_dir):
    tsv = write_tsv(tmp_path / "pairs.tsv", header=False)
    manifest = build(tmp_path / "from_tsv", tiny_models_dir, str(tsv))
    rows = check_build(tmp_path / "from_tsv", manifest, {"bad_row": 1})
    assert [(r["replaced_word"], r["replacement_word"]) for r in rows] == [("horse", "cow"), ("dogs", "cats")]
    table = manifest["config"]["captions_table"]
    # The path is named as every local input of a manifest is (no machine path is published).
    assert table["format"] == "tsv" and table["path"].startswith("local:pairs.tsv")
    assert table["files"] == {"pairs.tsv": sha256(tsv)}
    card = (tmp_path / "from_tsv" / "README.md").read_text()
    assert f"| `pairs.tsv` | `{sha256(tsv)}` |" in card and "| not_one_word_edit | input error | 2 |" in card
    assert str(tmp_path) not in card and f"the tsv table `{table['path']}`" in card

    jsonl = write_jsonl(tmp_path / "pairs.jsonl")
    manifest = build(tmp_path / "from_jsonl", tiny_models_dir, str(jsonl))
    check_build(tmp_path / "from_jsonl", manifest, {"bad_row": 1, "missing_id": 1})
    assert manifest["config"]["captions_table"]["files"] == {"pairs.jsonl": sha256(jsonl)}


def test_image_stage_builds_from_a_hub_table(tmp_path, tiny_models_dir, nltk_data_dir, local_hub):
    repo = "tester/caption-pairs"
    pair_dataset().push_to_hub(repo)
    head = HfApi().dataset_info(repo).sha
    # The Hub's own record of each LFS file's sha256: what the manifest must name.
    lfs = {
        f.path: f.lfs.sha256
        for f in HfApi().list_repo_tree(repo, repo_type="dataset", recursive=True)
        if getattr(f, "lfs", None)
    }
    out = tmp_path / "from_hub"
    manifest = build(out, tiny_models_dir, repo, "--captions-revision", "main", "--id-column", "pair_id")
    check_build(out, manifest, {})
    table = manifest["config"]["captions_table"]
    assert (table["repo"], table["revision"], table["commit"]) == (repo, "main", head)
    assert table["files"] == lfs and len(lfs) == 1
    card = (out / "README.md").read_text()
    assert f"`{repo}` on the Hub (revision `main`, commit `{head}`)" in card
