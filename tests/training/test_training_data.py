"""Training inputs without training: the pair-aware batch sampler (property test over seeds, 1 and
2 processes), the paper's mixture counts, the decorrelation ratio, unmixed counterfactuals held
out whole, the sweep statistics, their directions and `--summarize-only`, the NegCLIP loss, COCO
5K / 1K recall against the ECCV suite, and the parser (every config field a flag with help, model
defaults, the kim2023 recipe)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from builders.app.cli import main as cli_main
from training.config import DataConfig, SourceRef
from training.data import BatchConfigError, PairBatchSampler
from training.mixtures import build_mixture, cf_counts
from training.sources import DataInputError

from helpers.training_helpers import COLORS, write_color_set, write_counterfactuals


def random_groups(rng: np.random.Generator) -> list[list[int]]:
    """Shuffled example ids cut into pairs and singles, like a mixture's groups."""
    ids = rng.permutation(int(rng.integers(20, 120))).tolist()
    groups, i = [], 0
    while i < len(ids):
        size = 2 if rng.random() < 0.6 and i + 1 < len(ids) else 1
        groups.append(ids[i : i + size])
        i += size
    return groups


@pytest.mark.parametrize("seed", range(25))
def test_pairs_batches_hold_both_members_on_1_and_2_processes(seed):
    rng = np.random.default_rng(1000 + seed)
    groups = random_groups(rng)
    batch = int(rng.choice([4, 8, 12]))
    partner = {m: tuple(g) for g in groups if len(g) == 2 for m in g}
    one = PairBatchSampler(groups, batch, 1, 0, seed=seed, keep_pairs=True)
    two = [PairBatchSampler(groups, batch, 2, r, seed=seed, keep_pairs=True) for r in range(2)]
    for epoch in range(3):
        for s in (one, *two):
            s.set_epoch(epoch)
        single = list(one)
        locals_ = [list(s) for s in two]
        assert len(single) == len(one) == len(locals_[0]) == len(locals_[1])
        seen: set[int] = set()
        for b, global_batch in enumerate(single):
            assert len(global_batch) == batch
            # The 2-process slices, concatenated in rank order, are the 1-process batch.
            assert locals_[0][b] + locals_[1][b] == global_batch
            assert not seen & set(global_batch), "an example twice in one epoch"
            seen |= set(global_batch)
            for local in (global_batch, *(lb[b] for lb in locals_)):
                for m in local:
                    if m in partner:
                        assert set(partner[m]) <= set(local), (m, partner[m], local)
        # Every pair is trained on in every epoch except those in the dropped tail.
        n_units = sum(len(g) == 2 for g in groups) + sum(len(g) == 1 for g in groups) // 2
        assert len(single) == n_units // (batch // 2)
    # The order is a function of (seed, epoch): a new sampler repeats it, another seed does not.
    again = PairBatchSampler(groups, batch, 1, 0, seed=seed, keep_pairs=True)
    again.set_epoch(2)
    assert list(again) == single
    other = PairBatchSampler(groups, batch, 1, 0, seed=seed + 1, keep_pairs=True)
    other.set_epoch(2)
    assert len(single) < 2 or list(other) != single


def test_resumed_epoch_starts_at_the_given_batch():
    groups = [[i] for i in range(40)]
    s = PairBatchSampler(groups, 4, 1, 0, seed=3)
    s.set_epoch(1)
    full = list(s)
    s.set_epoch(1, start=3)
    assert list(s) == full[3:]


@pytest.mark.parametrize("batch,procs", [(1, 1), (2, 2), (6, 2)])
def test_batch_that_cannot_hold_a_pair_is_an_error(batch, procs):
    with pytest.raises(BatchConfigError, match="pair|even"):
        PairBatchSampler([[0, 1], [2]], batch, procs, 0, keep_pairs=True)


def test_cf_counts_are_the_papers():
    """Le et al. 2023 §5: from 17,410 captions and their 34,820 counterfactual rows, base is
    8,705 + 8,706 samples, medium 17,410 + 26,115, all 17,410 + 34,820."""
    real, whole, extra = cf_counts(17410, "cf:base")
    assert (real, 2 * whole + extra) == (8705, 8706)
    real, whole, extra = cf_counts(17410, "cf:medium")
    assert (real, 2 * whole + extra) == (17410, 26115)
    real, whole, extra = cf_counts(17410, "cf:all")
    assert (real, 2 * whole + extra) == (17410, 34820)


@pytest.fixture(scope="module")
def color_real(tmp_path_factory) -> Path:
    return write_color_set(tmp_path_factory.mktemp("real"), {"train": 2, "val": 1, "test": 1})


@pytest.mark.parametrize("mix", ["cf:base", "cf:medium", "cf:all"])
def test_counterfactual_mixture_counts_and_split(tmp_path, color_real, mix):
    n_pairs = 13  # odd, so every rounding rule shows
    cf = write_counterfactuals(tmp_path / "cf", list(range(1, n_pairs + 1)))
    cfg = DataConfig(
        real=SourceRef(str(color_real)),
        counterfactuals=SourceRef(str(cf)),
        mix=mix,
        data_seed=5,
        real_train_splits=("train",),
    )
    m = build_mixture(cfg)
    frac_real, frac_cf = {"cf:base": (0.5, 0.25), "cf:medium": (1, 0.75), "cf:all": (1, 1)}[mix]
    want_real = math.ceil(frac_real * n_pairs)
    want_cf = 2 * math.ceil(frac_cf * n_pairs) if mix != "cf:medium" else math.ceil(0.75 * 2 * n_pairs)
    both = [m.train, m.validation, m.test]  # trained, selected on, scored by the ITM deltas
    assert sum(s.counts().get("real", 0) for s in both) == want_real
    assert sum(s.counts().get("counterfactual", 0) for s in both) == want_cf

    # 80/20 over units (a pair: its real row and its rows); no unit is split, and the held-out
    # 20 % is halved into the validation examples and those of the ITM deltas' pairs.
    def pair(s, i):  # pair p is made from image id p + 1 (write_counterfactuals above)
        if s.column[i] != "image":
            return s.row[i]
        return s.tables[s.table_of[i]][s.row[i]]["image_id"] - 1

    train_p, val_p, test_p = ({pair(s, i) for i in range(len(s))} for s in both)
    units = len(train_p | val_p | test_p)
    held = int(0.2 * units)
    assert (len(val_p), len(test_p)) == (held // 2, held - held // 2)
    assert not train_p & val_p and not train_p & test_p and not val_p & test_p
    train_pairs = {g for g in m.train.group if g >= 0}
    assert sorted(m.train.group.count(g) for g in train_pairs) == [2] * len(train_pairs)
    # The ITM pairs: the whole pairs of the scored half.
    assert sorted(p for _, p in m.heldout_cf) == sorted({g for g in m.test.group if g >= 0})
    # Real examples pair the original caption with the real image of source_image_id.
    for s in both:
        for i, origin in enumerate(s.origin):
            if origin == "real":
                table = s.tables[s.table_of[i]]
                image_id = table[s.row[i]]["image_id"]
                assert s.caption[i] == f"a {list(COLORS)[(image_id - 1) % len(COLORS)]} cube"
    # Same data seed, same mixture; another seed, another choice.
    again = build_mixture(cfg)
    assert again.train.row == m.train.row and again.train.column == m.train.column
    cfg.data_seed = 6
    other = build_mixture(cfg)
    assert (other.train.row, other.train.column) != (m.train.row, m.train.column)


def test_unmixed_counterfactuals_are_held_out_whole_and_not_trained_on(tmp_path, color_real):
    from training.mixtures import eval_only_sets

    n_pairs = 5
    cf = write_counterfactuals(tmp_path / "cf", list(range(1, n_pairs + 1)), split="test")
    cfg = DataConfig(
        real=SourceRef(str(color_real)),
        real_train_splits=("train",),
        mix="none",
        counterfactuals=SourceRef(str(cf)),
        counterfactuals_split="test",
    )
    m, plain = (
        build_mixture(cfg),
        build_mixture(DataConfig(real=SourceRef(str(color_real)), real_train_splits=("train",))),
    )
    assert m.train.counts() == plain.train.counts() == {"real": 2 * len(COLORS) * 5}
    assert (m.train.table_of, m.train.row, m.train.caption) == (
        plain.train.table_of,
        plain.train.row,
        plain.train.caption,
    )
    # Every pair of the split, in row order, from the counterfactuals table.
    assert [row for _, row in m.heldout_cf] == list(range(n_pairs))
    (k,) = {k for k, _ in m.heldout_cf}
    assert m.train.tables[k]["caption_0"] == [f"a {list(COLORS)[p % len(COLORS)]} cube" for p in range(n_pairs)]
    assert [(r.path, r.split, r.rows) for r in m.records][-1] == (str(cf), "test", n_pairs)
    # --eval-only: the same pairs without any real table.
    held = eval_only_sets(DataConfig(counterfactuals=SourceRef(str(cf)), counterfactuals_split="test"))
    assert [row for _, row in held.heldout_cf] == list(range(n_pairs)) and len(held.train) == 0
    assert [(r.path, r.split) for r in held.records] == [(str(cf), "test")]


@pytest.fixture(scope="module")
def decorrelation_builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
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


@pytest.mark.parametrize("ratio", [0.1, 0.25, None])
def test_decorrelation_ratio_counts_and_pairs(decorrelation_builds, ratio):
    from datasets import load_dataset

    cc, dec = decorrelation_builds
    cfg = DataConfig(real=SourceRef(str(cc)), decorrelation=SourceRef(str(dec)), mix="decorrelation", ratio=ratio)
    m = build_mixture(cfg)
    real = load_dataset(str(cc), "default")
    n_real = sum(len(r["caption_ids"]) for s in ("train", "restval") for r in real[s])
    dprime = load_dataset(str(dec), "default", split="train")
    counts = m.train.counts()
    assert counts["real"] == n_real
    assert counts["decorrelation"] == (len(dprime) if ratio is None else math.ceil(ratio * n_real))
    # Each grouped D' row sits with the real example of the same image and caption id.
    for g in m.train.groups():
        if len(g) == 2:
            real_i, syn_i = sorted(g, key=lambda i: m.train.origin[i] != "real")
            row = dprime[m.train.row[syn_i]]
            assert m.train.origin[syn_i] == "decorrelation"
            assert m.train.caption[real_i] == row["original_caption"]
            assert m.train.negative[syn_i] == row["original_caption"]


def test_ratio_needing_more_synthetic_rows_than_exist_is_an_error(decorrelation_builds):
    cc, dec = decorrelation_builds
    with pytest.raises(DataInputError, match=r"--ratio 5.0 needs .* rows of D' but .* has \d+"):
        build_mixture(
            DataConfig(real=SourceRef(str(cc)), decorrelation=SourceRef(str(dec)), mix="decorrelation", ratio=5.0)
        )


def test_welch_one_tailed_matches_the_formula(tmp_path):
    """The sweep's p-value equals Welch's t with Welch–Satterthwaite degrees of freedom."""
    from scipy import stats

    from training.sweep import welch_one_tailed

    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 9), rng.normal(0.3, 2.0, 14)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    assert welch_one_tailed(a, b, greater=True) == pytest.approx(stats.t.sf(t, df), rel=1e-9)
    assert welch_one_tailed(a, b, greater=False) == pytest.approx(stats.t.cdf(t, df), rel=1e-9)


def test_cosine_schedule_with_warmup():
    from training.config import TrainConfig
    from training.trainer import lr_lambda

    cfg = TrainConfig()
    cfg.optim.schedule, cfg.optim.warmup_steps = "cosine", 4
    f = lr_lambda(cfg, steps_per_epoch=10, total_steps=24)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(14) == pytest.approx(0.5) and f(24) == pytest.approx(0.0)
    assert all(f(s) > f(s + 1) for s in range(4, 23))


@pytest.mark.slow
def test_coco_5k_and_1k_recall_equal_the_eccv_suite_on_the_real_test_split():
    """The trainer's 5-captions-per-image R@K on the real COCO 5K ids (from the annotations
    shipped in eccv_caption), in the coco-captions build's row order (image ids ascending),
    equals the ECCV suite's coco_5k recalls on the same embeddings, and its 1K fold means equal
    the suite's coco_1k ones (folds from `coco_test_ids.npy`, not from the row order)."""
    from counterfactory_metrics.map_at_r.eccv_annotations import read_positives
    from training.eval_data import EvalData, check_eccv_split, keep_standard_coco_captions, retrieval_folds
    from training.evaluation import eccv_metrics, retrieval_metrics
    from training.sources import DataInputError

    i2t = read_positives("coco").i2t
    image_ids = np.array(sorted(i2t))
    # A sixth caption of image 0, as COCO has for a few test images (an id outside the 25,000):
    # the 5-captions-per-image protocol leaves it out.
    extra = max(c for caps in i2t.values() for c in caps) + 1
    caption_ids = np.array([c for i in image_ids for c in sorted(i2t[i])] + [extra])
    owner = np.repeat(image_ids, [len(i2t[i]) for i in image_ids])
    owner = np.append(owner, image_ids[0])
    rng = np.random.default_rng(0)
    # Captions near their image, so R@K is far from 0 (and continuous scores: no ties).
    image_emb = rng.normal(size=(len(image_ids), 8)).astype(np.float32)
    text_emb = image_emb[np.searchsorted(image_ids, owner)] + rng.normal(scale=0.3, size=(len(caption_ids), 8)).astype(
        np.float32
    )
    data = EvalData(
        image_ids=image_ids,
        caption_ids=caption_ids,
        caption_image=owner,
        captions=[f"caption {c}" for c in caption_ids],
    )
    keep_standard_coco_captions(data)
    assert len(data.caption_ids) == len(data.captions) == 25_000 and extra not in data.caption_ids
    assert data.captions[-1] == f"caption {data.caption_ids[-1]}"
    emb = {"image": image_emb, "text": text_emb[:-1]}
    caption_ids, owner = data.caption_ids, data.caption_image
    folds = retrieval_folds(image_ids)
    # The standard folds are not blocks of consecutive image ids, so the row order would differ.
    assert len(folds) == 5 and not any(
        np.array_equal(f, np.arange(n * 1000, (n + 1) * 1000)) for n, f in enumerate(folds)
    )
    data.folds = folds
    check_eccv_split(data, "the test split")
    ours, eccv = retrieval_metrics(emb, data, (1, 5, 10)), eccv_metrics(emb, data)
    assert len(image_ids) == 5000 and ours["zeroshot_retrieval/text_retrieval_recall@1"] > 0.05
    for k in (1, 5, 10):
        for d, kind in (("i2t", "text"), ("t2i", "image")):
            assert ours[f"zeroshot_retrieval/{kind}_retrieval_recall@{k}"] == pytest.approx(
                eccv[f"eccv/coco_5k_r{k}_{d}"], abs=1e-9
            )
            assert ours[f"zeroshot_retrieval_1k/{kind}_retrieval_recall@{k}"] == pytest.approx(
                eccv[f"eccv/coco_1k_r{k}_{d}"], abs=1e-9
            )
    # A split missing one of the 5K images cannot be scored by the suite: refused up front.
    keep = image_ids != image_ids[7]
    short = EvalData(
        image_ids=image_ids[keep],
        caption_ids=caption_ids[owner != image_ids[7]],
        caption_image=owner[owner != image_ids[7]],
    )
    with pytest.raises(
        DataInputError,
        match=r"--eccv needs the COCO 5K test split .* 4999 images "
        r"\(0 outside it.*1 of its images and 5 of its captions",
    ):
        check_eccv_split(short, "the test split")


def _ce(logits: np.ndarray, target: int) -> float:
    """Cross-entropy of one row of logits, by hand (log-sum-exp minus the target's logit)."""
    top = logits.max()
    return float(top + np.log(np.exp(logits - top).sum()) - logits[target])


def test_negclip_loss_is_cross_entropy_over_texts_and_unmasked_negative_columns():
    """NegCLIP (Yuksekgonul et al. 2023): image i's softmax runs over [all texts | the extra
    negatives of the rows that have one]; text j's softmax over the images is CLIP's."""
    import torch

    from training.losses import clip_loss

    rng = np.random.default_rng(0)
    n, scale = 6, 7.0
    img, txt, neg = (rng.normal(size=(n, 5)) for _ in range(3))
    mask = np.array([True, False, True, True, False, True])
    sim = scale * img @ txt.T
    with_neg = np.concatenate([sim, scale * img @ neg[mask].T], axis=1)  # [texts | 4 negatives]
    i2t = np.mean([_ce(with_neg[i], i) for i in range(n)])
    i2t_plain = np.mean([_ce(sim[i], i) for i in range(n)])
    t2i = np.mean([_ce(sim[:, j], j) for j in range(n)])
    assert i2t > i2t_plain + 1e-3  # the negatives are hard enough to show

    def loss(negatives=None, m=mask) -> float:
        t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
        return float(
            clip_loss(
                t(img),
                t(txt),
                torch.tensor(scale, dtype=torch.float64),
                None if negatives is None else t(negatives),
                torch.tensor(m),
            )
        )

    assert loss(neg) == pytest.approx((i2t + t2i) / 2, rel=1e-12)
    assert loss() == pytest.approx((i2t_plain + t2i) / 2, rel=1e-12)
    # Masked rows add no column: their negative can be anything, and all masked is plain CLIP.
    other = neg.copy()
    other[~mask] = rng.normal(size=(int((~mask).sum()), 5)) * 10
    assert loss(other) == pytest.approx(loss(neg), rel=1e-12)
    assert loss(neg, np.zeros(n, dtype=bool)) == pytest.approx(loss(), rel=1e-12)


def _write_sweep(root: Path, seeds: dict[int, dict[str, float]]) -> Path:
    for seed, metrics in seeds.items():
        (root / f"seed-{seed}").mkdir(parents=True)
        (root / f"seed-{seed}" / "run.json").write_text(json.dumps({"final_metrics": metrics}))
    return root


def test_sweep_tests_lower_is_better_metrics_for_lower_values(tmp_path):
    """A model that leaves fewer ITM deltas below zero, or a lower loss, is better: the one-tailed
    test there is H1 'run < baseline'; for R@1 it is 'run > baseline'."""
    from scipy import stats

    from training.sweep import summarize

    base = {
        "itm/IR_c_frac_below_zero": [0.42, 0.45, 0.40, 0.44],
        "val_loss": [2.1, 2.3, 2.2, 2.25],
        "zeroshot_retrieval/image_retrieval_recall@1": [0.30, 0.32, 0.31, 0.29],
    }
    run = {
        "itm/IR_c_frac_below_zero": [0.31, 0.28, 0.33, 0.30],
        "val_loss": [1.9, 1.8, 2.0, 1.85],
        "zeroshot_retrieval/image_retrieval_recall@1": [0.36, 0.38, 0.35, 0.37],
    }
    # Directions from what the metrics mean (written here, not read from the sweep).
    alternative = {
        "itm/IR_c_frac_below_zero": "less",
        "val_loss": "less",
        "zeroshot_retrieval/image_retrieval_recall@1": "greater",
    }
    _write_sweep(tmp_path / "base", {s: {m: v[s] for m, v in base.items()} for s in range(4)})
    _write_sweep(tmp_path / "run", {s: {m: v[s - 10] for m, v in run.items()} for s in range(10, 14)})
    summary = summarize(tmp_path / "run", tmp_path / "base")
    rows = {r["metric"]: r for r in summary["metrics"]}
    table = (tmp_path / "run" / "summary.md").read_text()
    for metric, alt in alternative.items():
        p = stats.ttest_ind(run[metric], base[metric], equal_var=False, alternative=alt).pvalue
        assert rows[metric]["p_value"] == pytest.approx(p, rel=1e-9) and p < 0.01, metric
        shown = metric.replace("_", r"\_")  # metric names are plain text in Markdown
        line = next(line for line in table.splitlines() if line.startswith(f"| {shown} |"))
        assert ("run < baseline" if alt == "less" else "run > baseline") in line, line


def test_sweep_summarize_only_needs_no_seeds(tmp_path, capsys):
    from training.sweep import main as sweep_main

    r1 = {"zeroshot_retrieval/image_retrieval_recall@1": [0.30, 0.34, 0.35], "val_loss": [2.0, 1.9, 2.3]}
    _write_sweep(tmp_path / "run", {s: {m: v[s - 7] for m, v in r1.items()} for s in (7, 8, 9)})
    assert sweep_main(["--output", str(tmp_path / "run"), "--summarize-only"]) == 0
    table = (tmp_path / "run" / "summary.md").read_text()
    for metric, values in r1.items():
        v, shown = np.array(values), metric.replace("_", r"\_")
        line = next(line for line in table.splitlines() if line.startswith(f"| {shown} |"))
        assert line == f"| {shown} | 3 | {v.mean():.4f} ± {v.std(ddof=1):.4f} |", line
    assert sorted(json.loads((tmp_path / "run" / "summary.json").read_text())["runs"]) == [
        "seed-7",
        "seed-8",
        "seed-9",
    ]
    # Running a sweep still needs its seeds: a one-line error, nothing trained.
    assert sweep_main(["--output", str(tmp_path / "new"), "--", "--real", "x"]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("counterfactory: error: ")] == [
        "counterfactory: error: --seeds is needed to run a sweep (e.g. --seeds 107-131); to summarise the finished "
        "seeds only, pass --summarize-only"
    ], err
    assert not (tmp_path / "new").exists()


def _parse(*argv: str):
    from training.options import build_parser, config_from_args

    return config_from_args(build_parser().parse_args(["--real", "out/cc", "--output", "run", *argv]))


def test_train_help_lists_every_config_field_with_help(capsys):
    """One field table: every field of TrainConfig's sections and --recipe is a flag of
    `counterfactory train` (a dataset field also its --NAME-revision), and every flag has help."""
    import argparse
    from dataclasses import fields

    from builders.app.cli import build_parser as cli_parser
    from training.config import TrainConfig

    with pytest.raises(SystemExit) as done:
        cli_main(["train", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    cfg = TrainConfig()
    expected = {"--recipe"}
    for section in (cfg.data, cfg.optim, cfg.run):
        for f in fields(section):
            flag = "--" + f.name.replace("_", "-")
            expected |= {flag, f"{flag}-revision"} if "SourceRef" in str(f.type) else {flag}
    subcommands = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {opt: a for a in subcommands.choices["train"]._actions for opt in a.option_strings}
    assert len(expected) == 69 and expected <= set(actions)  # with --first-stage, --rerank-k
    for flag in expected:
        assert f" {flag} " in shown or f" {flag}\n" in shown, flag
    for flag, action in actions.items():
        assert action.help and action.help.strip(), f"{flag} has no help text"


def test_open_clip_backend_defaults_to_vit_b_32_with_openai_weights(tmp_path, monkeypatch):
    import open_clip

    import training.cross_training
    import training.trainer
    from builders.engine.errors import UserFacingError
    from builders.models.clip_ids import OPEN_CLIP, ClipId

    cfg = _parse("--backend", "open_clip")
    assert (cfg.run.model, cfg.run.pretrained) == ("ViT-B-32", "openai")
    clip = cfg.run.clip_id()
    assert (clip.name, clip.pretrained) == ("ViT-B-32", "openai")
    # Weights open_clip's registry knows (a listing: nothing is downloaded).
    assert "openai" in open_clip.list_pretrained_tags_by_model("ViT-B-32")
    explicit = _parse("--backend", "open_clip", "--model", "ViT-B-32", "--pretrained", "laion2b_s34b_b79k")
    clip = explicit.run.clip_id()
    assert (clip.name, clip.pretrained) == ("ViT-B-32", "laion2b_s34b_b79k")
    assert _parse().run.clip_id().name == "openai/clip-vit-base-patch32"
    with pytest.raises(UserFacingError, match="--pretrained names open_clip weights"):
        _parse("--pretrained", "openai")
    with pytest.raises(UserFacingError, match="already says which weights"):
        _parse("--backend", "open_clip", "--model", "ViT-B-32:openai", "--pretrained", "openai")

    # The trainer asks the backend for exactly that model (stopped there: no download).
    class Loaded(Exception):
        pass

    def fake_load(clip):
        raise Loaded(clip)

    monkeypatch.setattr(training.cross_training, "load_backend", fake_load)
    with pytest.raises(Loaded) as got:
        training.trainer.run(_parse("--backend", "open_clip", "--output", str(tmp_path / "run")))
    assert got.value.args == (ClipId(OPEN_CLIP, "ViT-B-32", "ViT-B-32", "openai"),)


@pytest.mark.parametrize(
    "argv, model",
    [
        (("--backend", "open_clip", "--model", "hf-hub:"), "hf-hub:"),
        (("--backend", "open_clip", "--model", "local-dir:"), "local-dir:"),
        (("--backend", "open_clip", "--model", ":openai"), ":openai"),
        (("--model", ""), ""),
    ],
)
def test_a_model_id_naming_nothing_is_one_line_before_anything_is_loaded(argv, model, tmp_path, capsys):
    """Parsed once, from the flags: no load is tried and no run folder made for an id that names
    no model; the line names --model and the spellings it takes."""
    from helpers.build_helpers import error_line

    out = tmp_path / "run"
    assert cli_main(["train", "--real", str(tmp_path), "--output", str(out), *argv]) == 2
    line = error_line(capsys)
    assert f"--model {model!r} names no model" in line, line
    assert "ARCH[:TAG]" in line and "hf-hub:ORG/REPO" in line and "local-dir:PATH" in line, line
    assert not out.exists()


def test_kim2023_recipe_is_the_decorrelation_papers():
    """Kim et al. 2023 §4.1, CLIP: 10 epochs, batch 256, Adam, learning rate 2e-6, multiplied by
    0.5 every 2 epochs."""
    from training.trainer import lr_lambda

    cfg = _parse("--recipe", "kim2023")
    o = cfg.optim
    assert (o.epochs, o.batch_size, o.optimizer, o.lr) == (10, 256, "adam", 2e-6)
    # Plain Adam: no weight decay, no warm-up.
    assert (o.weight_decay, o.warmup_steps) == (0, 0)
    # The lr the trainer applies in each epoch (first and last step): halved every 2 epochs.
    factor = lr_lambda(cfg, steps_per_epoch=3, total_steps=30)
    for epoch in range(10):
        assert factor(3 * epoch) == factor(3 * epoch + 2) == 0.5 ** (epoch // 2), epoch
    # A flag overrides one field and keeps the rest.
    o = _parse("--recipe", "kim2023", "--lr", "1e-5").optim
    assert (o.epochs, o.batch_size, o.optimizer, o.lr) == (10, 256, "adam", 1e-5)


def test_a_path_only_image_cell_is_one_line_and_never_opened(tmp_path):
    """A cell `{"bytes": None, "path": ...}` names a file of the user's, chosen by whoever made
    the dataset: the trainer refuses the table in one line and never opens that file."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from helpers.training_helpers import REAL_FEATURES, png

    secret = tmp_path / "home" / "secret.png"
    secret.parent.mkdir()
    secret.write_bytes(png((13, 200, 77)))
    opened: list[str] = []
    watched = str(secret.parent)

    def audit(event: str, args: tuple) -> None:
        if (
            watched
            and event == "open"
            and isinstance(args[0], (str, bytes, os.PathLike))
            and os.fsdecode(args[0]).startswith(watched)
        ):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)
    real = tmp_path / "real"
    (real / "data").mkdir(parents=True)
    rows = [
        {
            "image": {"bytes": png((200, 20, 20)), "path": None},
            "image_id": 1,
            "caption_ids": [1],
            "captions": ["a red cube"],
        },
        {
            "image": {"bytes": None, "path": str(secret)},
            "image_id": 2,
            "caption_ids": [2],
            "captions": ["a green cube"],
        },
    ]
    # Written with pyarrow, so `datasets` does not embed the file the path-only cell names.
    pq.write_table(
        pa.Table.from_pylist(rows, schema=REAL_FEATURES.arrow_schema), real / "data" / "train-00000-of-00001.parquet"
    )
    with pytest.raises(DataInputError) as raised:
        build_mixture(DataConfig(real=SourceRef(str(real)), real_train_splits=("train",)))
    watched = ""
    message = str(raised.value)
    assert "\n" not in message
    assert (
        f"(config 'default', split 'train'): 1 cell(s) of image column 'image' hold no image "
        f"bytes (row 1: path {str(secret)!r})" in message
    )
    assert opened == [], "the trainer opened the file a path-only cell names"
