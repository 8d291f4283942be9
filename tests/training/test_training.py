"""`training/finetune_clip.py` end to end on the fixture builds with the tiny CLIP: 1 vs 2
processes, `counterfactory train` = `accelerate launch`, kill -9 + `--resume latest`, learning
sanity, in-loop metrics = the evaluate modules post hoc, counterfactuals scored without being
trained on, bad inputs, datasets by revision from the local Hub and `--push-to-hub`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch

from builders.app.cli import main as cli_main
from training.finetune_clip import main as train_main

from helpers.build_helpers import ACCELERATE, accelerate_cmd
from helpers.training_helpers import (
    COLORS,
    PYTHON,
    REPO_ROOT,
    SCRIPT,
    final_metrics,
    kill_at_checkpoint,
    read_jsonl,
    weights,
    write_color_set,
    write_counterfactuals,
)

pytestmark = pytest.mark.e2e  # tests/README.md: the end-to-end tier


@pytest.fixture(scope="module")
def builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    root = tmp_path_factory.mktemp("builds")
    assert (
        cli_main(
            [
                "build",
                "coco-captions",
                "--coco-root",
                str(coco_fixture_dir),
                "--splits",
                "train",
                "restval",
                "val",
                "test",
                "--output",
                str(root / "cc"),
            ]
        )
        == 0
    )
    assert (
        cli_main(
            [
                "build",
                "decorrelation",
                "--coco-root",
                str(coco_fixture_dir),
                "--fill",
                "zero",
                "--output",
                str(root / "dec"),
            ]
        )
        == 0
    )
    return root / "cc", root / "dec"


def base_args(builds, tiny_models_dir, out: Path, *extra: str) -> list[str]:
    cc, dec = builds
    return [
        "--real",
        str(cc),
        "--decorrelation",
        str(dec),
        "--mix",
        "decorrelation",
        "--ratio",
        "0.3",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--batch-size",
        "8",
        "--lr",
        "1e-3",
        "--num-workers",
        "1",
        "--output",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def scored_cf(builds, tmp_path_factory) -> Path:
    """A counterfactuals build that `single_run` scores but does not train on, with as many pairs
    as test images: the itm_score_deltas module takes the six scores of a pair as one row, so
    the real and counterfactual groups must be equally long."""
    from datasets import load_dataset

    n_test = len(load_dataset(str(builds[0]), "default", split="test"))
    return write_counterfactuals(tmp_path_factory.mktemp("cf") / "cf", list(range(1, n_test + 1)))


@pytest.fixture(scope="module")
def single_run(builds, scored_cf, tiny_models_dir, tmp_path_factory) -> Path:
    """One process, pairs kept together, 6 steps: the reference for the 2-process run (the
    counterfactuals are only scored, so its training is that of base_args) and the post hoc
    metric check."""
    out = tmp_path_factory.mktemp("single") / "run"
    assert (
        train_main(
            base_args(
                builds,
                tiny_models_dir,
                out,
                "--hard-negatives",
                "pairs",
                "--max-steps",
                "6",
                "--counterfactuals",
                str(scored_cf),
            )
        )
        == 0
    )
    return out


@pytest.mark.accelerate
def test_two_processes_give_the_same_loss_curve(single_run, builds, tiny_models_dir, tmp_path):
    out = tmp_path / "two"
    cmd = accelerate_cmd(
        SCRIPT,
        *base_args(
            builds, tiny_models_dir, out, "--hard-negatives", "pairs", "--max-steps", "6", "--expect-processes", "2"
        ),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["processes"] == 2
    one, two = read_jsonl(single_run / "loss.jsonl"), read_jsonl(out / "loss.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 7))
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-4, atol=1e-5)
    two_w = weights(out / "final")
    for name, w in weights(single_run / "final").items():
        # Attention is invariant to the key bias, so its gradient is float noise that Adam
        # scales up to full lr steps: those weights differ by design, not by a data difference.
        if not name.endswith("k_proj.bias"):
            np.testing.assert_allclose(two_w[name], w, atol=1e-4, err_msg=name)


@pytest.mark.accelerate
def _flat(value, prefix: str = "") -> dict:
    """A nested record's numbers, keyed by their path (None kept: it must match too)."""
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{prefix}/{key}").items()}
    if isinstance(value, list):
        return {k: v for n, sub in enumerate(value) for k, v in _flat(sub, f"{prefix}/{n}").items()}
    return {prefix: value}


def test_counterfactory_train_runs_what_accelerate_launch_runs(builds, tiny_models_dir, tmp_path):
    """`counterfactory train` and `accelerate launch training/finetune_clip.py` are one trainer:
    the same run record, loss curve and metrics."""

    def args(out: Path) -> list[str]:
        return base_args(builds, tiny_models_dir, out, "--max-steps", "3", "--eval-every", "2")

    launched, cli = tmp_path / "launched", tmp_path / "cli"
    # One process: accelerate's single-process launcher (its --multi_gpu one needs 2 or more).
    one_process = [
        str(ACCELERATE),
        "launch",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    proc = subprocess.run(
        [*one_process, str(SCRIPT), *args(launched)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cli_main(["train", *args(cli)]) == 0
    # Equal up to float summation order (accelerate launch sets the process's CPU thread count).
    want, got = (json.loads((d / "run.json").read_text()) for d in (launched, cli))
    want_metrics, got_metrics = want.pop("final_metrics"), got.pop("final_metrics")
    # The numbers (the final metrics, their intervals, the base model's and before -> after).
    numbers = ("final_intervals", "before_metrics", "before_after")
    want_numbers, got_numbers = ({k: d.pop(k) for k in numbers} for d in (want, got))
    assert got == want  # config, datasets, example counts, steps
    assert got_metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert got_metrics[key] == pytest.approx(value, abs=1e-5), key
    for name in numbers:
        assert _flat(got_numbers[name]) == pytest.approx(_flat(want_numbers[name]), abs=1e-5), name
    want_loss, got_loss = read_jsonl(launched / "loss.jsonl"), read_jsonl(cli / "loss.jsonl")
    assert [r["step"] for r in got_loss] == [r["step"] for r in want_loss] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in got_loss], [r["loss"] for r in want_loss], atol=1e-5)


def test_loss_and_lr_reach_tensorboard(single_run):
    """With TensorBoard installed (the dev extra), accelerate's tracker writes the logged loss
    and lr under OUTPUT/logs: the event file holds the loss curve of loss.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted((single_run / "logs").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file under logs/"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert {"loss", "lr"} <= set(acc.Tags()["scalars"])
    curve = read_jsonl(single_run / "loss.jsonl")
    logged = acc.Scalars("loss")
    assert [e.step for e in logged] == [r["step"] for r in curve]
    np.testing.assert_allclose([e.value for e in logged], [r["loss"] for r in curve], rtol=1e-6)


def test_kill_and_resume_latest_equals_an_uninterrupted_run(builds, tiny_models_dir, tmp_path):
    # 91 examples / batch 8 = 11 steps per epoch; 8 steps, killed after the step-4 checkpoint.
    extra = ("--max-steps", "8", "--save-every", "2", "--real-test-split", "", "--real-val-split", "")
    killed = tmp_path / "killed"
    kill_at_checkpoint([PYTHON, str(SCRIPT), *base_args(builds, tiny_models_dir, killed, *extra)], killed, 4)
    losses_at_kill = read_jsonl(killed / "loss.jsonl")
    assert train_main(base_args(builds, tiny_models_dir, killed, *extra, "--resume", "latest")) == 0

    straight = tmp_path / "straight"
    assert train_main(base_args(builds, tiny_models_dir, straight, *extra)) == 0
    resumed_w, straight_w = weights(killed / "final"), weights(straight / "final")
    assert resumed_w.keys() == straight_w.keys()
    for name, w in straight_w.items():
        np.testing.assert_allclose(resumed_w[name], w, atol=1e-5, err_msg=name)
    # The resumed loss curve continues the killed one and equals the uninterrupted one.
    resumed, uninterrupted = read_jsonl(killed / "loss.jsonl"), read_jsonl(straight / "loss.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted] == list(range(1, 9))
    np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in uninterrupted], atol=1e-5)
    assert [r["loss"] for r in resumed[:4]] == [r["loss"] for r in losses_at_kill[:4]]


def test_learning_sanity_r1_well_above_chance(tmp_path, tiny_models_dir):
    """Captions name the image's colour: a hundred-odd steps must lift R@1 far above chance
    (1/8 both ways: 8 test images, 5 captions each). This checks that gradients flow."""
    data = write_color_set(tmp_path / "colors", {"train": 6, "val": 1, "test": 1})
    out = tmp_path / "run"
    assert (
        train_main(
            [
                "--real",
                str(data),
                "--real-train-splits",
                "train",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--batch-size",
                "16",
                "--lr",
                "2e-3",
                "--epochs",
                "200",
                "--max-steps",
                "120",
                "--eval-every",
                "60",
                "--num-workers",
                "0",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    evals = read_jsonl(out / "metrics.jsonl")
    assert [e["step"] for e in evals] == [60, 120, 120]
    baseline = tmp_path / "baseline"
    assert (
        train_main(
            [
                "--real",
                str(data),
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--eval-only",
                "--output",
                str(baseline),
                "--num-workers",
                "0",
            ]
        )
        == 0
    )
    chance = 1 / 8
    before, after = final_metrics(baseline), evals[-1]
    assert (
        after["zeroshot_retrieval/text_retrieval_recall@1"] >= 4 * chance
        and after["zeroshot_retrieval/image_retrieval_recall@1"] >= 4 * chance
    ), after
    assert (
        after["zeroshot_retrieval/image_retrieval_recall@1"]
        > before["zeroshot_retrieval/image_retrieval_recall@1"] + 0.25
    )


def test_in_loop_metrics_equal_the_evaluate_modules_post_hoc(single_run, builds, scored_cf, tiny_models_dir):
    from datasets import load_dataset

    from counterfactory_metrics.itm_score_deltas.deltas import random_derangement
    from builders.models.clip_ids import parse_clip_id
    from training.backends import load_backend
    from training.config import SourceRef
    from training.eval_config import EvalConfig
    from training.eval_data import load_eval_data
    from training.evaluation import compute_embeddings
    from training.mixtures import CF_COLUMNS
    from training.sources import open_table

    cc, dec = builds
    final = read_jsonl(single_run / "metrics.jsonl")[-1]
    assert final["final"] and final == {**final, **final_metrics(single_run)}
    emb = np.load(single_run / "embeddings.npz")

    # The saved model reproduces the saved embeddings; the counterfactual ones are every pair of
    # the scored build in row order, image_0 / image_1 (caption_0 / caption_1) alternating.
    cfg = EvalConfig(real=SourceRef(str(cc)), decorrelation=SourceRef(str(dec)))
    cf_table, _ = open_table(SourceRef(str(scored_cf)), "default", "test", CF_COLUMNS)
    every_pair = [(0, row) for row in range(len(cf_table))]
    backend = load_backend(parse_clip_id(str(single_run / "final"), "transformers"))
    backend.module.eval()
    again = compute_embeddings(backend.module, backend, load_eval_data(cfg, every_pair, [cf_table], None), 16, 0)
    for key in ("image", "text", "query_image", "gallery_text", "cf_image", "cf_text"):
        np.testing.assert_allclose(again[key], emb[key], atol=1e-5, err_msg=key)

    # Retrieval: map_at_r in similarity mode, positives straight from the build's rows.
    test = load_dataset(str(cc), "default", split="test")
    image_ids, per_image = list(test["image_id"]), list(test["caption_ids"])
    caption_ids = [c for ids in per_image for c in ids]
    owner = {c: i for i, ids in zip(image_ids, per_image, strict=True) for c in ids}
    map_at_r = evaluate.load(str(REPO_ROOT / "evaluate_modules" / "map_at_r"))
    sim = emb["image"] @ emb["text"].T
    i2t = map_at_r.compute(
        similarity=sim,
        positives=dict(zip(image_ids, per_image, strict=True)),
        query_ids=image_ids,
        gallery_ids=caption_ids,
        k_values=[1, 5, 10],
        map_at_r=False,
        r_precision=False,
    )
    t2i = map_at_r.compute(
        similarity=sim.T,
        positives={c: [owner[c]] for c in caption_ids},
        query_ids=caption_ids,
        gallery_ids=image_ids,
        k_values=[1, 5, 10],
        map_at_r=False,
        r_precision=False,
    )
    for k in (1, 5, 10):
        assert final[f"zeroshot_retrieval/text_retrieval_recall@{k}"] == pytest.approx(i2t[f"recall_at_{k}"])
        assert final[f"zeroshot_retrieval/image_retrieval_recall@{k}"] == pytest.approx(t2i[f"recall_at_{k}"])

    # ODmAP@k: the odmap module on top-k ids against the gallery's mention lists.
    queries = load_dataset(str(dec), "odmap_queries", split="test")
    gallery = load_dataset(str(dec), "odmap_gallery", split="test")
    removed, present = list(queries["removed_classes"]), list(queries["present_classes"])
    mentioned = list(gallery["mentioned_classes"])
    classes = sorted({c for rows in (removed, present, mentioned) for r in rows for c in r})
    mentions = np.array([[c in set(r) for c in classes] for r in mentioned])
    ranked = np.argsort(-(emb["query_image"] @ emb["gallery_text"].T), axis=1, kind="stable")[:, :10]
    odmap = evaluate.load(str(REPO_ROOT / "evaluate_modules" / "odmap"))
    res = odmap.compute(
        retrieved=ranked.tolist(),
        removed_classes=removed,
        present_classes=present,
        mention_matrix=mentions,
        class_names=classes,
        k_values=[1, 5, 10],
    )
    for k in (1, 5, 10):
        assert final[f"odmap/ODmAP@{k}"] == pytest.approx(res[f"ODmAP@{k}"])

    # ITM deltas: the itm_score_deltas module on G = cosine similarity of the saved embeddings.
    # Random group: real pair (C_o, I_o) = image i of the test split with its first caption,
    # (C_r, I_r) = its partner in the seeded random derangement (seed 0) with its first caption.
    # Counterfactual group: (C_o, I_o^s) = (caption_0, image_0), (C_c, I_c^s) = (caption_1,
    # image_1) of every scored pair.
    first = np.cumsum([0] + [len(ids) for ids in per_image])[:-1]
    img, cap = emb["image"], emb["text"][first]
    nxt = random_derangement(len(img), 0)  # "a random other pair": seeded, never itself
    i0, i1, c0, c1 = emb["cf_image"][0::2], emb["cf_image"][1::2], emb["cf_text"][0::2], emb["cf_text"][1::2]
    g = lambda c, i: (c * i).sum(1)  # noqa: E731
    itm = evaluate.load(str(REPO_ROOT / "evaluate_modules" / "itm_score_deltas"))
    deltas = itm.compute(
        g_cr_ir=g(cap[nxt], img[nxt]),
        g_cr_io=g(cap[nxt], img),
        g_co_ir=g(cap, img[nxt]),
        g_cc_ics=g(c1, i1),
        g_cc_ios=g(c1, i0),
        g_co_ics=g(c0, i1),
    )
    for name in ("IR_r", "TR_r", "IR_c", "TR_c"):
        for stat in ("mean", "median", "frac_below_zero"):
            assert final[f"itm/{name}_{stat}"] == pytest.approx(deltas[name][stat], abs=1e-6), (name, stat)

    # Object necessity per removed class c: PN = (s(x, y) - s(x', y)) / s(x, y), s = (cos + 1) / 2,
    # averaged over the queries x' removing c whose source image x is in the test split and the
    # original captions y of x that mention c (the gallery's mention lists).
    test_row = {i: r for r, i in enumerate(image_ids)}
    gallery_row = {c: r for r, c in enumerate(gallery["caption_id"])}
    s = lambda i, t: (float(i @ t) + 1) / 2  # noqa: E731
    pn: dict[str, list[float]] = {}
    for q, (image_id, caption_ids) in enumerate(zip(queries["image_id"], queries["caption_ids"], strict=True)):
        if image_id not in test_row:
            continue
        x, x_removed = emb["image"][test_row[image_id]], emb["query_image"][q]
        for caption_id in caption_ids:
            y = emb["gallery_text"][gallery_row[caption_id]]
            for c in set(removed[q]) & set(mentioned[gallery_row[caption_id]]):
                pn.setdefault(c, []).append((s(x, y) - s(x_removed, y)) / s(x, y))
    assert pn, "no query of the fixture has its source image in the test split"
    in_loop = {k for k in final if k.startswith("necessity/PN_") and k != "necessity/PN_mean"}
    assert in_loop == {f"necessity/PN_{c}" for c in pn}
    for c, values in pn.items():
        assert final[f"necessity/PN_{c}"] == pytest.approx(np.mean(values), abs=1e-5), c
    assert final["necessity/PN_mean"] == pytest.approx(np.mean([v for vs in pn.values() for v in vs]), abs=1e-5)
    # run.json names that s as the benchmark's PN records and a cross-encoder's run.json do.
    assert json.loads((single_run / "run.json").read_text())["necessity"] == {"s_kind": "cosine_mapped_to_0_1"}


def _error_of(capsys, argv) -> str:
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("counterfactory: error: ")]
    assert len(errors) == 1, err
    return errors[0]


def test_bad_inputs_are_one_line_errors_before_training(builds, tiny_models_dir, tmp_path, capsys):
    cc, dec = builds
    out = tmp_path / "run"
    # The decorrelation build's default config has images but no `captions` / `caption_ids`.
    err = _error_of(capsys, base_args((dec, dec), tiny_models_dir, out))
    assert "has no column(s) ['caption_ids', 'captions']" in err and str(dec) in err
    err = _error_of(capsys, base_args(builds, tiny_models_dir, out, "--ratio", "5"))
    assert "--ratio 5.0 needs" in err and "lower --ratio" in err
    err = _error_of(capsys, base_args(builds, tiny_models_dir, out, "--hard-negatives", "pairs", "--batch-size", "1"))
    assert "needs at least 2 rows per process batch" in err
    err = _error_of(capsys, base_args(builds, tiny_models_dir, out, "--real-revision", "v1.0.0"))
    assert "is a local folder" in err
    # The fixture's test split is a handful of images, not the COCO 5K set the ECCV suite scores.
    err = _error_of(capsys, base_args(builds, tiny_models_dir, out, "--eccv"))
    assert "--eccv needs the COCO 5K test split" in err and f"{cc} split 'test'" in err
    err = _error_of(capsys, base_args(builds, tiny_models_dir, out, "--eccv", "--real-test-split", ""))
    assert "--eccv scores the COCO 5K test split" in err
    err = _error_of(capsys, base_args(builds, tiny_models_dir, out, "--coco-instances", str(cc)))
    assert "--coco-instances adds PMRP to the ECCV Caption suite: give --eccv too" in err
    assert not (out / "loss.jsonl").exists() and not (out / "checkpoints").exists()


def test_open_clip_backend_trains_and_saves_a_local_dir_model(builds, tiny_models_dir, tmp_path):
    import open_clip

    from safetensors.numpy import load_file

    out = tmp_path / "oc"
    assert (
        train_main(
            base_args(
                builds,
                tiny_models_dir,
                out,
                "--backend",
                "open_clip",
                "--max-steps",
                "2",
                "--hard-negatives",
                "negclip",
                "--real-test-split",
                "test",
                "--lock-image",
            )
        )
        == 0
    )
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{out / 'final'}")
    assert len(read_jsonl(out / "loss.jsonl")) == 2
    # --lock-image: the image tower is the initial one, the text tower moved.
    before = load_file(str(tiny_models_dir / "open_clip" / "open_clip_model.safetensors"))
    after = load_file(str(out / "final" / "open_clip_model.safetensors"))
    assert all(np.array_equal(after[k], v) for k, v in before.items() if k.startswith("visual."))
    assert not np.array_equal(after["token_embedding.weight"], before["token_embedding.weight"])
    # Evaluating the saved model reproduces the run's final numbers.
    again = tmp_path / "again"
    assert (
        train_main(
            [
                "--real",
                str(builds[0]),
                "--decorrelation",
                str(builds[1]),
                "--backend",
                "open_clip",
                "--model",
                f"local-dir:{out / 'final'}",
                "--eval-only",
                "--num-workers",
                "0",
                "--output",
                str(again),
            ]
        )
        == 0
    )
    for key, value in final_metrics(again).items():
        if not key.startswith("val_loss"):
            assert final_metrics(out)[key] == pytest.approx(value, abs=1e-6), key
    assert isinstance(model, torch.nn.Module)


def test_datasets_by_revision_from_the_hub_and_push_to_hub(builds, tiny_models_dir, tmp_path, capsys, local_hub):
    from huggingface_hub import HfApi, hf_hub_download
    from transformers import CLIPModel

    cc, _ = builds
    repo = "trainer-test/coco-captions"
    assert cli_main(["publish", str(cc), "--repo-id", repo, "--version", "v1.0.0"]) == 0
    sha = HfApi().dataset_info(repo, revision="v1.0.0").sha
    out = tmp_path / "run"
    args = [
        "--real",
        repo,
        "--real-revision",
        "v1.0.0",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--batch-size",
        "8",
        "--max-steps",
        "2",
        "--num-workers",
        "0",
        "--output",
        str(out),
    ]
    err = _error_of(capsys, [*args[:3], "v9.9.9", *args[4:]])
    assert "revision 'v9.9.9' does not exist" in err and repo in err
    assert train_main([*args, "--push-to-hub", "trainer-test/tiny-clip"]) == 0
    tables = json.loads((out / "run.json").read_text())["tables"]
    assert {(t["path"], t["revision"], t["commit"]) for t in tables} == {(repo, "v1.0.0", sha)}
    card = Path(hf_hub_download("trainer-test/tiny-clip", "README.md")).read_text()
    assert (
        repo in card and "v1.0.0" in card and sha in card and r"zeroshot\_retrieval/text\_retrieval\_recall@1" in card
    )
    pushed = CLIPModel.from_pretrained("trainer-test/tiny-clip")
    local = weights(out / "final")
    for name, param in pushed.state_dict().items():
        if name in local:
            np.testing.assert_array_equal(param.numpy(), local[name])


def test_sweep_writes_mean_std_and_a_one_tailed_welch_test(tmp_path, tiny_models_dir):
    from scipy import stats

    from training.sweep import main as sweep_main

    data = write_color_set(tmp_path / "colors", {"train": 2, "val": 1, "test": 1})
    common = [
        "--real",
        str(data),
        "--real-train-splits",
        "train",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--num-workers",
        "0",
    ]
    assert (
        sweep_main(
            [
                "--seeds",
                "1-3",
                "--data-seed-offset",
                "1",
                "--output",
                str(tmp_path / "base"),
                "--",
                *common,
                "--eval-only",
            ]
        )
        == 0
    )
    assert (
        sweep_main(
            [
                "--seeds",
                "4,5,6",
                "--output",
                str(tmp_path / "run"),
                "--baseline",
                str(tmp_path / "base"),
                "--",
                *common,
                "--batch-size",
                "16",
                "--lr",
                "2e-3",
                "--max-steps",
                "20",
            ]
        )
        == 0
    )
    runs = {s: final_metrics(tmp_path / "run" / f"seed-{s}") for s in (4, 5, 6)}
    base = {s: final_metrics(tmp_path / "base" / f"seed-{s}") for s in (1, 2, 3)}
    assert json.loads((tmp_path / "run" / "seed-5" / "run.json").read_text())["config"]["run"]["seed"] == 5
    table = (tmp_path / "run" / "summary.md").read_text()
    for metric in ("zeroshot_retrieval/image_retrieval_recall@1", "val_loss"):
        v, shown = np.array([m[metric] for m in runs.values()]), metric.replace("_", r"\_")
        row = next(line for line in table.splitlines() if line.startswith(f"| {shown} |"))
        assert f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" in row, row
    v = np.array([m["zeroshot_retrieval/image_retrieval_recall@1"] for m in runs.values()])
    b = np.array([m["zeroshot_retrieval/image_retrieval_recall@1"] for m in base.values()])
    p = stats.ttest_ind(v, b, equal_var=False, alternative="greater").pvalue
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    got = next(r for r in summary["metrics"] if r["metric"] == "zeroshot_retrieval/image_retrieval_recall@1")
    assert got["p_value"] == pytest.approx(p, nan_ok=True)
    assert (tmp_path / "run" / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_counterfactual_mixture_run_reports_itm_deltas_on_held_out_pairs(tmp_path, tiny_models_dir):
    from training.mixtures import cf_counts

    real = write_color_set(tmp_path / "real", {"train": 2, "test": 1})
    cf = write_counterfactuals(tmp_path / "cf", list(range(1, 16)))
    out = tmp_path / "run"
    assert (
        train_main(
            [
                "--real",
                str(real),
                "--real-train-splits",
                "train",
                "--counterfactuals",
                str(cf),
                "--mix",
                "cf:medium",
                "--hard-negatives",
                "negclip",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--batch-size",
                "4",
                "--max-steps",
                "3",
                "--num-workers",
                "0",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads((out / "run.json").read_text())
    n_real, whole, extra = cf_counts(15, "cf:medium")
    # Trained on, selected on (validation loss), and held out for the ITM deltas.
    train, val, test = record["train_examples"], record["validation_examples"], record["test_examples"]
    assert train["real"] + val.get("real", 0) + test.get("real", 0) == n_real
    assert sum(s.get("counterfactual", 0) for s in (train, val, test)) == 2 * whole + extra
    final = record["final_metrics"]
    assert "val_loss" in final
    assert "necessity" not in record and not [k for k in final if k.startswith("necessity/")]  # no PN: no s
    emb = np.load(out / "embeddings.npz")
    i0, i1, c0, c1 = emb["cf_image"][0::2], emb["cf_image"][1::2], emb["cf_text"][0::2], emb["cf_text"][1::2]
    assert len(i0) >= 1
    s = lambda c, i: (c * i).sum(1)  # noqa: E731
    assert final["itm/IR_c_mean"] == pytest.approx(float(np.mean(s(c1, i1) - s(c1, i0))), abs=1e-6)
    assert final["itm/TR_c_mean"] == pytest.approx(float(np.mean(s(c1, i1) - s(c0, i1))), abs=1e-6)
    # The pretrained baseline (--eval-only, same mixture and data seed) is scored on the same
    # held-out pairs and validation examples.
    base = tmp_path / "baseline"
    assert (
        train_main(
            [
                "--real",
                str(real),
                "--real-train-splits",
                "train",
                "--counterfactuals",
                str(cf),
                "--mix",
                "cf:medium",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--eval-only",
                "--num-workers",
                "0",
                "--output",
                str(base),
            ]
        )
        == 0
    )
    base_emb = np.load(base / "embeddings.npz")
    assert base_emb["cf_image"].shape == emb["cf_image"].shape
    assert "itm/IR_c_mean" in final_metrics(base) and "val_loss" in final_metrics(base)


def test_counterfactuals_without_a_cf_mix_are_scored_on_every_pair_not_trained_on(tmp_path, tiny_models_dir):
    real = write_color_set(tmp_path / "real", {"train": 2, "val": 1, "test": 1})
    n_pairs = 7
    cf = write_counterfactuals(tmp_path / "cf", list(range(1, n_pairs + 1)))
    common = [
        "--real",
        str(real),
        "--real-train-splits",
        "train",
        "--models",
        "tiny",
        "--tiny-models-dir",
        str(tiny_models_dir),
        "--batch-size",
        "8",
        "--lr",
        "1e-3",
        "--max-steps",
        "3",
        "--num-workers",
        "0",
    ]
    scored, plain = tmp_path / "scored", tmp_path / "plain"
    assert train_main([*common, "--counterfactuals", str(cf), "--output", str(scored)]) == 0
    assert train_main([*common, "--output", str(plain)]) == 0
    # Not trained on: the same examples, loss curve and weights as the run without it.
    with_cf, without = (json.loads((d / "run.json").read_text()) for d in (scored, plain))
    assert with_cf["train_examples"] == without["train_examples"] == {"real": 2 * len(COLORS) * 5}
    assert read_jsonl(scored / "loss.jsonl") == read_jsonl(plain / "loss.jsonl")
    scored_w = weights(scored / "final")
    for name, w in weights(plain / "final").items():
        np.testing.assert_array_equal(scored_w[name], w, err_msg=name)
    # Scored: all of the split (recorded in run.json, the local folder named by its contents),
    # both rows of every pair.
    cf_tables = [t for t in with_cf["tables"] if t["path"].startswith("local:cf@sha256:")]
    assert [{k: v for k, v in t.items() if k != "path"} for t in cf_tables] == [
        {"revision": None, "commit": None, "config": "default", "split": "test", "rows": n_pairs}
    ]
    emb = np.load(scored / "embeddings.npz")
    assert emb["cf_image"].shape[0] == emb["cf_text"].shape[0] == 2 * n_pairs
    itm_c = {k for k in final_metrics(scored) if k.startswith(("itm/IR_c", "itm/TR_c"))}
    assert {"itm/IR_c_mean", "itm/TR_c_mean"} <= itm_c
    assert not any(k.startswith("itm/IR_c") for k in final_metrics(plain))
    # --eval-only (no --real needed) scores the same pairs: the trained model gives its final numbers.
    again = tmp_path / "again"
    assert (
        train_main(
            [
                "--counterfactuals",
                str(cf),
                "--model",
                str(scored / "final"),
                "--eval-only",
                "--num-workers",
                "0",
                "--output",
                str(again),
            ]
        )
        == 0
    )
    np.testing.assert_allclose(np.load(again / "embeddings.npz")["cf_image"], emb["cf_image"], atol=1e-5)
    for key in itm_c:
        assert final_metrics(again)[key] == pytest.approx(final_metrics(scored)[key], abs=1e-6), key


def test_le2023_recipe_with_overrides_keeps_the_best_validation_checkpoint(tmp_path, tiny_models_dir):
    data = write_color_set(tmp_path / "colors", {"train": 4, "val": 1, "test": 1})
    out = tmp_path / "run"
    # 160 examples / 16 = 10 steps per epoch; the lr is multiplied by 1000 after 2 epochs, so
    # the model learns, then wrecks itself: the best validation loss is not the last one.
    assert (
        train_main(
            [
                "--real",
                str(data),
                "--real-train-splits",
                "train",
                "--models",
                "tiny",
                "--tiny-models-dir",
                str(tiny_models_dir),
                "--num-workers",
                "0",
                "--recipe",
                "le2023",
                "--lr",
                "2e-3",
                "--batch-size",
                "16",
                "--epochs",
                "3",
                "--schedule",
                "step",
                "--step-epochs",
                "2",
                "--step-gamma",
                "1000",
                "--warmup-steps",
                "3",
                "--max-grad-norm",
                "1.0",
                "--eval-every",
                "5",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    cfg = json.loads((out / "run.json").read_text())["config"]
    assert cfg["recipe"] == "le2023" and cfg["run"]["best_by_val_loss"]
    assert (cfg["optim"]["optimizer"], cfg["optim"]["weight_decay"], cfg["optim"]["lr"]) == ("adamw", 0.001, 2e-3)
    want = [2e-3 * min(1, (s + 1) / 3) * 1000 ** (s // 20) for s in range(30)]
    np.testing.assert_allclose([r["lr"] for r in read_jsonl(out / "loss.jsonl")], want, rtol=1e-9)
    # The final model is the evaluation with the lowest validation loss: evaluating it again
    # at the end gives that loss.
    in_loop = [e for e in read_jsonl(out / "metrics.jsonl") if not e["final"]]
    assert [e["step"] for e in in_loop] == [5, 10, 15, 20, 25, 30]
    losses = [e["val_loss"] for e in in_loop]
    assert min(losses) < losses[-1], losses
    assert final_metrics(out)["val_loss"] == pytest.approx(min(losses), abs=1e-6)
