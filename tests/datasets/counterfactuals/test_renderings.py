"""`counterfactory renderings` (issue #37 §2): coco-counterfactuals builds of one caption-pair table,
one per `--generator`, combined into one dataset with a config per generator — published to the
local Hub and loaded by config with equal pair ids, its card's per-generator counts and filter pass
rates checked against the rows and the source builds, shown per config by `counterfactory show`,
and every set of builds it must refuse refused in one line that names the folder, writing nothing.

Two tiny builds (sd15, sdxl) of 3 caption pairs from the same COCO fixture, built once for the
file; a directional threshold makes the generators keep different pairs."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset
from huggingface_hub import hf_hub_download

from builders.app.cli import main as cli_main
from builders.counterfactuals import renderings
from builders.counterfactuals.generators import GENERATORS
from builders.counterfactuals.renderings import wilson_interval
from builders.devtools.fixtures.coco import CocoFixtureConfig, write_coco_fixture
from builders.engine import owned_files
from builders.engine.sharding.build_files import file_sha256
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.output_guard import output_lock

from helpers.build_helpers import captions_build, error_line

GENERATORS_GIVEN = ("sd15", "sdxl")
IMAGE_ARGS = ["--image-size", "64", "--steps", "2", "--candidates", "3", "--candidate-batch", "3"]
#: Random tiny CLIP: only the directional filter tells candidates apart, per generator.
FILTER_ARGS = ["--directional-threshold", "0.1"]
FILTERS = ("text_image", "image_image", "directional")
#: The one `default` shard of each tiny build.
SHARD = "data/test-00000-of-00001.parquet"


def cf_build(out: Path, coco: Path, tiny: Path, generator: str, *extra: str) -> Path:
    argv = ["build", "coco-counterfactuals", "--coco-root", str(coco), "--models", "tiny"]
    argv += ["--tiny-models-dir", str(tiny), "--output", str(out), "--part-size", "4", "--max-captions", "6"]
    assert cli_main([*argv, "--generator", generator, *IMAGE_ARGS, *FILTER_ARGS, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_models_dir, nltk_data_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("renderings")
    coco = write_coco_fixture(root / "coco", CocoFixtureConfig(n_images=12, release="2017"))
    made = {g: cf_build(root / f"cf-{g}", coco, tiny_models_dir, g) for g in GENERATORS_GIVEN}
    return {**made, "coco": coco, "tiny": tiny_models_dir}


def combine(out: Path, *builds: Path, extra: tuple[str, ...] = ()) -> int:
    return cli_main(["renderings", "--output", str(out), *(str(b) for b in builds), *extra])


def manifest(folder: Path) -> dict:
    return json.loads((folder / "build_manifest.json").read_text())


def card_rows(card: str, generator: str) -> list[list[str]]:
    """The cells of every card table row of `generator`."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in card.splitlines()
        if line.startswith(f"| `{generator}` |")
    ]


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %"


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links not followed) and its digest: what a refusal must keep."""
    if not folder.exists():
        return {}
    return {
        p.relative_to(folder).as_posix(): "link" if p.is_symlink() else file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def refused(capsys, out: Path, *builds: Path, extra: tuple[str, ...] = ()) -> str:
    """The one error line of a refused combine, after checking OUT was left as it was."""
    before = tree(out)
    existed = out.exists()
    assert combine(out, *builds, extra=extra) == 2
    assert out.exists() == existed and tree(out) == before
    return error_line(capsys)


def copy_build(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


# -- the combined dataset ----------------------------------------------------------------------


@pytest.mark.e2e
def test_combined_builds_publish_and_load_by_config_with_equal_pair_ids(builds, tmp_path, local_hub, repo_id):
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    assert cli_main(["publish", str(out), "--repo-id", repo_id, "--version", "v1.0.0"]) == 0

    loaded = {g: load_dataset(repo_id, g, split="test", revision="v1.0.0") for g in GENERATORS_GIVEN}
    captions = load_dataset(repo_id, "captions", split="test", revision="v1.0.0")
    table = {r["id"]: (r["caption_0"], r["caption_1"]) for r in captions}
    for g, ds in loaded.items():
        assert set(ds["generator"]) == {g}
        # Every generator's rows are its own build's, in its order.
        assert ds["id"] == pq.read_table(builds[g] / SHARD, columns=["id"]).column("id").to_pylist()
        for row in ds.remove_columns(["image_0", "image_1"]):
            assert table[row["id"]] == (row["caption_0"], row["caption_1"])
    shared = set(loaded["sd15"]["id"]) & set(loaded["sdxl"]["id"])
    assert shared and shared != set(loaded["sd15"]["id"]) | set(loaded["sdxl"]["id"])
    by_id = {g: {r["id"]: r for r in ds.remove_columns(["image_0", "image_1"])} for g, ds in loaded.items()}
    for pair in shared:
        assert (by_id["sd15"][pair]["caption_0"], by_id["sd15"][pair]["caption_1"]) == (
            by_id["sdxl"][pair]["caption_0"],
            by_id["sdxl"][pair]["caption_1"],
        )
    default = load_dataset(repo_id, split="test", revision="v1.0.0")
    assert default["id"] == loaded["sd15"]["id"] and set(default["generator"]) == {"sd15"}

    card = Path(hf_hub_download(repo_id, "README.md", repo_type="dataset", revision="v1.0.0")).read_text()
    front = card.split("---")[1]
    assert re.findall(r"config_name: (\S+)", front)[:3] == ["sd15", "sdxl", "captions"]
    assert f"Pairs kept by every generator: **{len(shared)}**" in card
    for g in GENERATORS_GIVEN:
        source = manifest(builds[g])
        counts, tried = source["counts"], source["counts"]["image_candidates_tried"]
        kept = sum(len(pq.read_table(f, columns=["id"])) for f in (out / "data" / g).glob("*.parquet"))
        assert kept == len(loaded[g])
        generators_row = card_rows(card, g)[0]
        # Pairs in: every caption pair of the table went to each generator's image stage.
        assert generators_row[7] == f"{kept} / {len(captions)}"
        assert GENERATORS[g].license in generators_row[3]
        # Each generator's guidance, at its model's reference (#43): the paper's U(7.5, 15) for
        # sd15, diffusers' SDXL default 5.0.
        assert generators_row[5] == {"sd15": "7.5–15.0 (reference 7.5–15.0)", "sdxl": "5.0 (reference 5.0)"}[g]
        expected = [percent(tried - counts[f"image_rejected_{f}"], tried) for f in FILTERS]
        assert generators_row[9:13] == [*expected, percent(counts["image_candidates_passed"], tried)]
        record = manifest(out)["renderings"][g]
        assert (record["rows"], record["pairs_in"], record["counts"]) == (kept, len(captions), counts)
        assert (record["generator"], record["steps"], record["resolution"]) == (g, 2, 64)
        assert record["model"] == source["models"]["sd"] and record["source"].startswith(f"local:cf-{g}@sha256:")


@pytest.mark.e2e
def test_benchmark_of_the_combined_build_scores_each_generator_and_pairs_them(builds, tmp_path):
    """The acceptance's chain on real builds: renderings -> `counterfactory benchmark`. Each
    generator is scored on its own rows; the generator-bias records pair sd15 and sdxl on the
    pairs both kept, as many as the combined build's manifest says."""
    from training.report.results import read_results

    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    report = tmp_path / "report"
    argv = ["benchmark", "--models", "tiny", "--tiny-models-dir", str(builds["tiny"]), "--counterfactuals", str(out)]
    assert cli_main([*argv, "--bootstrap", "200", "--output", str(report)]) == 0
    records = read_results(report / "results.jsonl")
    for g in GENERATORS_GIVEN:
        itm = [r for r in records if r["dataset"] == f"counterfactuals/{g}" and r["task"] == "itm"]
        assert itm and all(r["generator"] == g for r in itm)
        rows = len(pq.read_table(builds[g] / SHARD, columns=["id"]))
        assert {r["n_units"]["IR_c_mean"] for r in itm} == {rows}
    bias = [r for r in records if r["task"] == "generator_bias"]
    common = manifest(out)["common_pairs"]
    assert len(bias) == 2 and common > 0  # one per tiny model, sd15 vs sdxl
    assert {(r["generator"], r["other_generator"]) for r in bias} == {("sd15", "sdxl")}
    assert {n for r in bias for n in r["n_units"].values()} == {common}
    assert "Generator bias" in (report / "report.md").read_text()


@pytest.mark.e2e
def test_a_generator_that_kept_no_pair_has_no_config_and_is_named(builds, tmp_path):
    """A third generator whose every candidate fails the directional filter keeps 0 pairs: it has
    no config (an empty output is not published), the common pairs are those of the generators
    with a config (what the benchmark compares), and the card says which generator kept none."""
    nothing = cf_build(tmp_path / "cf-sd3", builds["coco"], builds["tiny"], "sd3", "--directional-threshold", "0.99")
    assert manifest(nothing)["outputs"]["default/test"]["rows"] == 0
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"], nothing) == 0
    ids = {g: set(pq.read_table(builds[g] / SHARD, columns=["id"]).column("id").to_pylist()) for g in GENERATORS_GIVEN}
    combined = manifest(out)
    assert combined["renderings"]["sd3"]["rows"] == 0 and combined["without_pairs"] == ["sd3"]
    assert combined["common_pairs"] == len(ids["sd15"] & ids["sdxl"]) > 0
    card = (out / "README.md").read_text()
    assert re.findall(r"config_name: (\S+)", card.split("---")[1])[:3] == ["sd15", "sdxl", "captions"]
    assert "`sd3` kept no pair: it has no config" in card
    assert card_rows(card, "sd3")[0][7].startswith("0 / ")


@pytest.mark.e2e
def test_show_draws_each_config(builds, tmp_path, capsys):
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    for g in GENERATORS_GIVEN:
        capsys.readouterr()
        assert cli_main(["show", str(out), "--config", g, "--output", str(tmp_path / f"gallery-{g}")]) == 0
        rows = len(pq.read_table(builds[g] / SHARD, columns=["id"]))
        assert f"({g}/test, {rows} rows" in capsys.readouterr().out
        # The stats page counts this generator's own skips, not the other's (nor none).
        stats = (tmp_path / f"gallery-{g}" / "stats.html").read_text()
        dropped = manifest(builds[g])["skipped"]["no_image_candidate_passed_clip"]
        assert f"<td>no_image_candidate_passed_clip</td><td>{dropped}</td>" in stats


@pytest.mark.e2e
def test_overwrite_replaces_a_combined_build(builds, tmp_path, capsys):
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    line = refused(capsys, out, builds["sdxl"], builds["sd15"])
    assert str(out) in line and "--overwrite" in line
    assert combine(out, builds["sdxl"], builds["sd15"], extra=("--overwrite",)) == 0
    assert manifest(out)["config"]["generators"] == ["sdxl", "sd15"]
    listed = {f["path"] for f in manifest(out)["files"]}
    on_disk = {p for p in tree(out) if not p.startswith(".parts/")} - {"README.md", "build_manifest.json"}
    assert on_disk == listed
    # A combine killed before its manifest (written last) is replaced the same way: its files
    # are listed as pending (.parts/written.json) from before they are copied.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(renderings, "write_manifest", _killed)
        with pytest.raises(KeyboardInterrupt):
            combine(out, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert not (out / "build_manifest.json").exists()
    assert "not empty" in refused(capsys, out, builds["sd15"], builds["sdxl"])
    assert combine(out, builds["sd15"], builds["sdxl"], extra=("--overwrite",)) == 0
    assert manifest(out)["config"]["generators"] == ["sd15", "sdxl"]


def _killed(*args):
    raise KeyboardInterrupt


@pytest.mark.e2e
def test_overwrite_deletes_only_the_files_the_combined_build_lists(builds, tmp_path, capsys):
    """Issue #41 §1: a file beside the build (not in its manifest), a listed file the user
    edited, and folders holding no build at all are refused by name, deleting nothing."""
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    extra = out / "data" / "sd15" / "extra.parquet"
    extra.write_bytes((out / "data" / "sd15" / Path(SHARD).name).read_bytes())
    line = refused(capsys, out, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert "data/sd15/extra.parquet (not listed)" in line and "nothing was deleted" in line
    extra.unlink()
    card = out / "README.md"
    card.write_text(card.read_text() + "my notes\n")
    line = refused(capsys, out, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert "README.md (changed since it was written)" in line
    card.unlink()  # a listed file that is gone is nothing to delete
    assert combine(out, builds["sd15"], builds["sdxl"], extra=("--overwrite",)) == 0

    # Folders holding no build: a manifest of `{}` beside a user's parquet file; an empty
    # `.parts/` beside a figure.
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "mine.parquet").write_bytes(b"PAR1 mine")
    (mine / "build_manifest.json").write_text("{}")
    line = refused(capsys, mine, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert str(mine) in line and "holds no build" in line
    plots = tmp_path / "plots"
    (plots / ".parts").mkdir(parents=True)
    (plots / "figures").mkdir()
    (plots / "figures" / "plot.png").write_bytes(b"\x89PNG mine")
    line = refused(capsys, plots, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert str(plots) in line and "holds no build" in line and "figures/plot.png" in line


@pytest.mark.e2e
def test_a_stage_images_build_of_a_build_s_caption_table_draws_the_same_table(builds, tmp_path):
    """Captions once, images per generator elsewhere: `--stage images --captions-from` a build
    reads that build's caption table, so the two combine."""
    argv = ["build", "coco-counterfactuals", "--stage", "images", "--captions-from", str(builds["sd15"])]
    argv += ["--models", "tiny", "--tiny-models-dir", str(builds["tiny"]), "--generator", "sdxl"]
    images = tmp_path / "cf-sdxl-images"
    assert cli_main([*argv, "--output", str(images), *IMAGE_ARGS, *FILTER_ARGS]) == 0
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], images) == 0
    captions = len(pq.read_table(builds["sd15"] / "data/captions/test-00000-of-00001.parquet", columns=["id"]))
    assert manifest(out)["renderings"]["sdxl"]["pairs_in"] == captions


def test_wilson_interval_matches_published_values():
    """Wilson (1927) score intervals at 95 %, as tabulated by Newcombe (1998, Table I: 81/263
    -> 0.2553-0.3662; 15/148 -> 0.0624-0.1605; 0/20 -> 0-0.1611; 1/29 -> 0.0061-0.1718)."""
    for kept, total, low, high in [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ]:
        assert wilson_interval(kept, total) == pytest.approx([low, high], abs=6e-5)
    assert wilson_interval(0, 0) is None


@pytest.mark.e2e
def test_builds_on_another_file_system_are_copied(builds, tmp_path, monkeypatch):
    """Where a hard link cannot be made (another file system: EXDEV), each file is copied."""

    def no_link(*args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    for g in GENERATORS_GIVEN:
        copied, original = out / "data" / g / Path(SHARD).name, builds[g] / SHARD
        assert copied.read_bytes() == original.read_bytes()
        assert not os.path.samefile(copied, original)
    listed = {f["path"]: f["sha256"] for f in manifest(out)["files"]}
    assert listed == {path: file_sha256(out / path) for path in listed}


@pytest.mark.e2e
def test_card_shows_names_from_data_as_plain_text(builds, tmp_path):
    """A build folder's name reaches the card (its source name): as text, never as Markdown/HTML."""
    odd = copy_build(builds["sdxl"], tmp_path / "cf|<b>sdxl")
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], odd) == 0
    card = (out / "README.md").read_text()
    assert "<b>" not in card and "&#60;b&#62;sdxl" in card


# -- refusals: one line naming the folder, nothing written -------------------------------------


@pytest.mark.e2e
def test_refuses_fewer_than_two_builds(builds, tmp_path, capsys):
    line = refused(capsys, tmp_path / "cf", builds["sd15"])
    assert str(builds["sd15"]) in line and "at least 2" in line


@pytest.mark.e2e
def test_refuses_an_unfinished_build(builds, tmp_path, capsys):
    unfinished = copy_build(builds["sdxl"], tmp_path / "cf-sdxl")
    (unfinished / "build_manifest.json").unlink()
    line = refused(capsys, tmp_path / "cf", builds["sd15"], unfinished)
    assert str(unfinished) in line and "not a finished build" in line


@pytest.mark.e2e
def test_refuses_a_build_that_is_still_writing(builds, tmp_path, capsys):
    writing = copy_build(builds["sdxl"], tmp_path / "cf-sdxl")
    with output_lock(OutputLayout(writing)):
        line = refused(capsys, tmp_path / "cf", builds["sd15"], writing)
    assert str(writing) in line and "still writing" in line


@pytest.mark.e2e
def test_refuses_a_captions_stage_build(builds, tmp_path, capsys):
    captions = tmp_path / "captions"
    argv = ["build", "coco-counterfactuals", "--stage", "captions", "--coco-root", str(builds["coco"])]
    argv += ["--models", "tiny", "--tiny-models-dir", str(builds["tiny"]), "--max-captions", "6"]
    assert cli_main([*argv, "--output", str(captions)]) == 0
    line = refused(capsys, tmp_path / "cf", builds["sd15"], captions)
    assert str(captions) in line and "--stage images" in line


@pytest.mark.e2e
def test_refuses_another_builder(builds, tmp_path, capsys):
    other = tmp_path / "coco-captions"
    assert captions_build(builds["coco"], other) == 0
    line = refused(capsys, tmp_path / "cf", builds["sd15"], other)
    assert str(other) in line and "not a coco-counterfactuals" in line


@pytest.mark.e2e
def test_refuses_two_builds_of_one_generator(builds, tmp_path, capsys):
    twin = copy_build(builds["sdxl"], tmp_path / "cf-sdxl-again")
    line = refused(capsys, tmp_path / "cf", builds["sdxl"], twin)
    assert str(twin) in line and str(builds["sdxl"]) in line and "--generator sdxl" in line


@pytest.mark.e2e
def test_refuses_builds_of_other_caption_tables(builds, tmp_path, capsys):
    fewer = cf_build(tmp_path / "cf-sdxl-4", builds["coco"], builds["tiny"], "sdxl", "--max-captions", "4")
    line = refused(capsys, tmp_path / "cf", builds["sd15"], fewer)
    assert str(fewer) in line and "max_captions" in line


@pytest.mark.e2e
def test_refuses_a_shared_pair_id_with_other_captions(builds, tmp_path, capsys):
    """A build claiming the same table (same recorded config) whose rows say otherwise: its shard
    rewritten with one caption changed, and its manifest updated to match."""
    forged = copy_build(builds["sdxl"], tmp_path / "cf-sdxl")
    shard = forged / SHARD
    table = pq.read_table(shard)
    captions = table.column("caption_1").to_pylist()
    changed = table.column("id")[0].as_py()
    captions[0] = captions[0] + " again"
    table = table.set_column(table.schema.get_field_index("caption_1"), "caption_1", pa.array(captions))
    pq.write_table(table, shard)
    record = manifest(forged)
    for entry in record["files"]:
        if entry["path"] == SHARD:
            entry.update(bytes=shard.stat().st_size, sha256=file_sha256(shard))
    (forged / "build_manifest.json").write_text(json.dumps(record))
    line = refused(capsys, tmp_path / "cf", builds["sd15"], forged)
    assert str(forged) in line and repr(changed) in line and "other captions" in line


@pytest.mark.e2e
def test_refuses_a_nonempty_output(builds, tmp_path, capsys):
    out = tmp_path / "cf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = refused(capsys, out, builds["sd15"], builds["sdxl"])
    assert str(out) in line and "not empty" in line
    # --overwrite replaces a build only, never a file it did not write.
    line = refused(capsys, out, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert str(out) in line and "notes.txt" in line
    (out / "notes.txt").unlink()
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    (out / "notes.txt").write_text("mine")
    line = refused(capsys, out, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert str(out) in line and "notes.txt" in line


@pytest.mark.e2e
def test_refuses_an_output_inside_a_build(builds, tmp_path, capsys):
    source = copy_build(builds["sdxl"], tmp_path / "cf-sdxl")
    line = refused(capsys, source / "combined", builds["sd15"], source)
    assert str(source) in line and "overlaps" in line


@pytest.mark.e2e
def test_never_reads_a_shard_through_a_symlink(builds, tmp_path, capsys):
    """A build whose listed shard is a link to a file outside it: refused, the file never read."""
    linked = copy_build(builds["sdxl"], tmp_path / "cf-sdxl")
    outside = tmp_path / "outside.parquet"
    shard = linked / SHARD
    shard.rename(outside)
    shard.symlink_to(outside)
    line = refused(capsys, tmp_path / "cf", builds["sd15"], linked)
    assert str(shard) in line and "symlink" in line


@pytest.mark.e2e
def test_overwrite_never_acts_through_a_data_folder_swapped_for_a_link_after_the_check(builds, tmp_path, capsys):
    """Issue #49: `OUT/data` is swapped for a symlink to the user's folder between the check of
    `--overwrite` and its deletions (a hook on the hashing, after the last listed shard is hashed
    by the discard's own check: no timing). Before, the user's files named as the shards were
    unlinked through the link and replaced by hard links to the shards."""
    out = tmp_path / "cf"
    assert combine(out, builds["sd15"], builds["sdxl"]) == 0
    shards = {f["path"]: f["sha256"] for f in manifest(out)["files"] if f["path"].startswith("data/")}
    mine = tmp_path / "mine"
    for rel in shards:
        (mine / rel).parent.mkdir(parents=True, exist_ok=True)
        (mine / rel).write_bytes(f"the user's own {rel}".encode())
    theirs = tree(mine)
    real, hits = owned_files.file_sha256, []

    def hashed_then_swapped(source):
        digest = real(source)
        hits.append(digest in shards.values())
        # The first check (before any work) and the discard's check each hash every shard once.
        if sum(hits) == 2 * len(shards) and hits[-1]:
            (out / "data").rename(tmp_path / "aside")
            (mine / "data").rename(tmp_path / "user")
            (out / "data").symlink_to(tmp_path / "user", target_is_directory=True)
        return digest

    ours = tree(out)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owned_files, "file_sha256", hashed_then_swapped)
        code = combine(out, builds["sd15"], builds["sdxl"], extra=("--overwrite",))
    assert tree(tmp_path / "user") == {rel.removeprefix("data/"): sha for rel, sha in theirs.items()}
    assert code == 2
    line = error_line(capsys)
    assert f"{out / 'data'} is a symlink" in line and "nothing was written or deleted" in line, line
    # Nothing of the build was deleted either: the real folder, moved aside, and the rest of OUT.
    moved = {f"data/{rel}": sha for rel, sha in tree(tmp_path / "aside").items()}
    assert {**tree(out), **moved, "data": "link"} == {**ours, "data": "link"}
