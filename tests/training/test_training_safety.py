"""The trainer's cases of issue #32, through its command line.

- `--push-to-hub` sends only the files the run wrote to `final/` (recorded with size and sha256
  in `final_manifest.json`): a planted `.env`, a symlink to a file outside the run or a stray file
  is refused in one line naming each, before any request reaches the Hub; a symlink under a
  model file's name is replaced, never written through. A clean run pushes exactly the listed files.
- Names from data (a `--zeroshot` folder's name) are plain text in metrics.md, the model card and
  a sweep's summary.md.
- Zero-shot images that do not decode (garbage bytes) or are too large (decompression bombs,
  `--max-image-pixels`) are counted skips; with none usable, one line.
- One line, before anything is trained or written: an invalid `--push-to-hub` repo id, `sweep
  --seeds` too many or a reversed range, an `--output` that is a file.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import zlib
from pathlib import Path

import datasets
import pytest
from huggingface_hub import HfApi
from PIL import Image

from builders.devtools.fixtures.classification import write_classification_fixture
from training.finetune_clip import main as train_main
from training.sweep import main as sweep_main

from helpers.publish_helpers import one_error_line
from helpers.training_helpers import read_jsonl, write_color_set
from helpers.training_helpers import tiny_args as train_args  # this file's adds --report-to none

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier

SECRET = "hf_TOP_SECRET_TOKEN_VALUE"
#: A folder name that is Markdown and HTML when written raw into a table.
HOSTILE = "zs|<img src=x onerror=alert(1)>"


def tiny_args(data, tiny_models_dir, out, *extra: str) -> list[str]:
    return train_args(data, tiny_models_dir, out, "--report-to", "none", *extra)


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return write_color_set(tmp_path_factory.mktemp("colors") / "colors", {"train": 4, "val": 1, "test": 1})


def _manifest_paths(out: Path) -> set[str]:
    return {f["path"] for f in json.loads((out / "final_manifest.json").read_text())["files"]}


def test_push_to_hub_sends_only_the_files_the_run_wrote(colors, tiny_models_dir, tmp_path, local_hub, repo_id, capsys):
    out = tmp_path / "run"
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "2")) == 0
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    final = out / "final"
    (final / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (final / "secret-link.txt").symlink_to(secret)
    (final / "notes.txt").write_text("my notes\n")

    # Continuing the run: refused before anything is trained (3 steps would add a loss row) or sent.
    assert (
        train_main(
            tiny_args(colors, tiny_models_dir, out, "--max-steps", "3", "--resume", "latest", "--push-to-hub", repo_id)
        )
        == 2
    )
    line = one_error_line(capsys)
    for name in (".env", "symlink secret-link.txt", "notes.txt", str(final)):
        assert name in line, line
    assert SECRET not in line
    assert not HfApi().repo_exists(repo_id, repo_type="model")
    assert len(read_jsonl(out / "loss.jsonl")) == 2

    for name in (".env", "secret-link.txt", "notes.txt"):
        (final / name).unlink()
    assert (
        train_main(
            tiny_args(colors, tiny_models_dir, out, "--max-steps", "3", "--resume", "latest", "--push-to-hub", repo_id)
        )
        == 0
    )
    listed = _manifest_paths(out)
    assert {"README.md", "config.json", "model.safetensors"} <= listed
    assert listed == {p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file()}
    assert set(HfApi().list_repo_files(repo_id, repo_type="model")) - {".gitattributes"} == listed


def test_a_second_push_leaves_the_repo_holding_only_the_new_model(
    colors, tiny_models_dir, tmp_path, local_hub, repo_id
):
    from training.checkpoint import push_to_hub

    out = tmp_path / "run"
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "1")) == 0
    api = HfApi()
    api.create_repo(repo_id, repo_type="model")
    # What an earlier push of another model left: weights in another format, a nested file.
    for stale in ("pytorch_model.bin", "open_clip/open_clip_model.safetensors"):
        api.upload_file(path_or_fileobj=b"old weights", path_in_repo=stale, repo_id=repo_id, repo_type="model")
    push_to_hub(out / "final", repo_id, out / "final_manifest.json")
    assert set(api.list_repo_files(repo_id, repo_type="model")) - {".gitattributes"} == _manifest_paths(out)


def test_a_symlink_under_a_model_file_name_is_refused_not_written_through(colors, tiny_models_dir, tmp_path, capsys):
    out = tmp_path / "run"
    outside = tmp_path / "outside.json"
    outside.write_text(SECRET)
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "1")) == 0
    # Planted in the finished run's final/, which the continued run would save again: refused
    # before it trains, naming it (#41: a file is replaced only as the run wrote it).
    config = out / "final" / "config.json"
    config.unlink()
    config.symlink_to(outside)
    capsys.readouterr()
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "2", "--resume", "latest")) == 2
    assert "symlink config.json" in capsys.readouterr().err
    assert outside.read_text() == SECRET and config.is_symlink()
    config.unlink()  # removed: the continued run writes the file again
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "2", "--resume", "latest")) == 0
    assert not config.is_symlink() and "model_type" in json.loads(config.read_text())
    assert "config.json" in _manifest_paths(out)


def test_a_listed_file_changed_after_the_run_is_not_pushed(colors, tiny_models_dir, tmp_path, local_hub, repo_id):
    from builders.engine.errors import UserFacingError
    from training.checkpoint import push_to_hub

    out = tmp_path / "run"
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "1")) == 0
    with (out / "final" / "config.json").open("a") as fh:
        fh.write(" ")
    with pytest.raises(UserFacingError, match=r"config\.json is missing or changed since the run"):
        push_to_hub(out / "final", repo_id, out / "final_manifest.json")
    # A manifest edited to list a dotfile does not make it publishable.
    (out / "final" / ".env").write_text(SECRET)
    manifest = json.loads((out / "final_manifest.json").read_text())
    manifest["files"].append({"path": ".env", "bytes": len(SECRET), "sha256": "0" * 64})
    (out / "final_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserFacingError, match=r"lists '\.env' \(a dotfile\)"):
        push_to_hub(out / "final", repo_id, out / "final_manifest.json")
    assert not HfApi().repo_exists(repo_id, repo_type="model")


def test_an_invalid_push_to_hub_repo_id_is_one_line_before_training(colors, tiny_models_dir, tmp_path, capsys):
    for bad in ("not a repo", "org/name/extra", "org/-name-"):
        out = tmp_path / "run"
        assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "1", "--push-to-hub", bad)) == 2
        line = one_error_line(capsys)
        assert "--push-to-hub" in line and repr(bad) in line, line
        assert not out.exists()  # no step, no checkpoint, not even the folder
    assert (
        train_main(tiny_args(colors, tiny_models_dir, tmp_path / "e", "--eval-only", "--push-to-hub", "org/name")) == 2
    )
    assert "--eval-only" in one_error_line(capsys)
    assert not (tmp_path / "e").exists()


def test_an_output_that_is_a_file_is_one_line(colors, tiny_models_dir, tmp_path, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("keep me\n")
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "1")) == 2
    line = one_error_line(capsys)
    assert "--output" in line and str(out) in line, line
    assert out.read_text() == "keep me\n"


def test_sweep_seeds_too_many_or_a_reversed_range_is_one_line(colors, tiny_models_dir, tmp_path, capsys):
    given = tiny_args(colors, tiny_models_dir, tmp_path / "unused", "--eval-only")
    train = given[: given.index("--output")] + given[given.index("--output") + 2 :]  # the sweep's own
    for seeds, expected in (("1-99999999999", "99,999,999,999 seeds"), ("9-3", "the range is empty")):
        out = tmp_path / "sweep"
        assert sweep_main(["--seeds", seeds, "--output", str(out), "--", *train]) == 2
        line = one_error_line(capsys)
        assert f"--seeds {seeds}" in line and expected in line, line
        assert not out.exists()


def test_data_names_are_plain_text_in_metrics_md_the_card_and_the_sweep_summary(colors, tiny_models_dir, tmp_path):
    zs = write_classification_fixture(tmp_path / HOSTILE, per_class=1)
    out = tmp_path / "run"
    assert train_main(tiny_args(colors, tiny_models_dir, out, "--max-steps", "1", "--zeroshot", str(zs))) == 0
    shown = r"zs\|&lt;img src=x onerror=alert(1)&gt;"
    for text in ((out / "metrics.md").read_text(), (out / "final" / "README.md").read_text()):
        assert "<img" not in text
        assert f"| zeroshot/{shown}-test/top1 |" in text
    assert shown in (out / "final" / "README.md").read_text()  # the table of datasets read

    from training.sweep import summarize

    for seed in (1, 2):
        (tmp_path / "sweep" / f"seed-{seed}").mkdir(parents=True)
        (tmp_path / "sweep" / f"seed-{seed}" / "run.json").write_text(
            json.dumps({"final_metrics": {f"zeroshot/{HOSTILE}-test/top1": 0.5}})
        )
    summarize(tmp_path / "sweep")
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "<img" not in summary and f"| zeroshot/{shown}-test/top1 | 2 |" in summary


def _png(rgb, size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, format="PNG")
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def _classification_set(root: Path, images: list[bytes], labels: list[int]) -> Path:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["red", "blue"])})
    root.mkdir(parents=True)
    datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in images], "label": labels}, features=features
    ).to_parquet(root / "test-00000-of-00001.parquet")
    return root


def test_zeroshot_images_that_do_not_decode_are_counted_skips(tiny_models_dir, tmp_path, caplog):
    good = [_png((200, 20, 20)), _png((20, 20, 200)), _png((210, 30, 10)), _png((10, 30, 210))]
    good_labels = [0, 1, 0, 1]
    bad = [b"\x00garbage, not an image" * 8, _png_header_only(30_000, 30_000), _png((200, 20, 20), (80, 80))]
    mixed = _classification_set(
        tmp_path / "mixed" / "colours", good[:2] + bad + good[2:], good_labels[:2] + [0, 1, 0] + good_labels[2:]
    )
    clean = _classification_set(tmp_path / "clean" / "colours", good, good_labels)
    common = [
        "--eval-only",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
        "--report-to",
        "none",
        "--max-image-pixels",
        "5000",
    ]
    with caplog.at_level(logging.WARNING):
        assert train_main([*common, "--zeroshot", str(mixed), "--output", str(tmp_path / "mixed-run")]) == 0
    record = json.loads((tmp_path / "mixed-run" / "run.json").read_text())
    assert record["skipped"] == {
        "zeroshot/colours-test/unreadable_image": 1,
        "zeroshot/colours-test/image_too_large": 2,
    }
    assert [t["rows"] for t in record["tables"]] == [7]
    assert any("skipped 3 of 7 images" in r.getMessage() for r in caplog.records)
    # The metrics are those of the four decodable images alone.
    assert train_main([*common, "--zeroshot", str(clean), "--output", str(tmp_path / "clean-run")]) == 0
    clean_metrics = json.loads((tmp_path / "clean-run" / "run.json").read_text())["final_metrics"]
    assert record["final_metrics"] == pytest.approx(clean_metrics)
    assert set(clean_metrics) >= {"zeroshot/colours-test/top1", "zeroshot/colours-test/mean_per_class_recall"}


def test_a_zeroshot_set_without_a_usable_image_is_one_line(tiny_models_dir, tmp_path, capsys):
    garbage = _classification_set(tmp_path / "garbage", [b"not an image", b"\xff\xd8 truncated"], [0, 1])
    out = tmp_path / "run"
    assert (
        train_main(
            [
                "--eval-only",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--num-workers",
                "0",
                "--report-to",
                "none",
                "--zeroshot",
                str(garbage),
                "--output",
                str(out),
            ]
        )
        == 2
    )
    line = one_error_line(capsys)
    assert "--zeroshot" in line and str(garbage) in line and "unreadable_image: 2" in line, line
    assert not (out / "run.json").exists()


def test_a_real_row_whose_caption_ids_and_captions_differ_is_one_line(tmp_path, tiny_models_dir, capsys):
    from helpers.training_helpers import REAL_FEATURES, write_split

    root = write_color_set(tmp_path / "colors", {"train": 1, "val": 1, "test": 1})
    train = datasets.Dataset.from_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    cols = train.cast_column("image", datasets.Image(decode=False)).to_dict()
    cols["caption_ids"][2] = cols["caption_ids"][2][:-1]  # a hand-made table: one id short
    write_split(root, "train", cols, REAL_FEATURES)
    out = tmp_path / "run"
    assert train_main(tiny_args(root, tiny_models_dir, out, "--max-steps", "1")) == 2
    line = one_error_line(capsys)
    assert "--real split train, row 2" in line and "caption_ids has 4 ids but captions has 5" in line, line
    assert not (out / "final").exists()
