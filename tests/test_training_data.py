"""Training inputs without training: the pair-aware batch sampler (property test over seeds, 1 and
2 processes), the paper's mixture counts, the decorrelation ratio, and the sweep statistics."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from builders.infra.cli import main as cli_main
from training.config import DataConfig, SourceRef
from training.data import BatchConfigError, PairBatchSampler
from training.mixtures import build_mixture, cf_counts
from training.sources import DataInputError

sys.path.insert(0, str(Path(__file__).parent))
from training_helpers import COLORS, write_color_set, write_counterfactuals  # noqa: E402


def random_groups(rng: np.random.Generator) -> list[list[int]]:
    """Shuffled example ids cut into pairs and singles, like a mixture's groups."""
    ids = rng.permutation(int(rng.integers(20, 120))).tolist()
    groups, i = [], 0
    while i < len(ids):
        size = 2 if rng.random() < 0.6 and i + 1 < len(ids) else 1
        groups.append(ids[i:i + size])
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
    cfg = DataConfig(real=SourceRef(str(color_real)), counterfactuals=SourceRef(str(cf)), mix=mix,
                     data_seed=5, real_train_splits=("train",))
    m = build_mixture(cfg)
    frac_real, frac_cf = {"cf:base": (0.5, 0.25), "cf:medium": (1, 0.75), "cf:all": (1, 1)}[mix]
    want_real = math.ceil(frac_real * n_pairs)
    want_cf = 2 * math.ceil(frac_cf * n_pairs) if mix != "cf:medium" else math.ceil(0.75 * 2 * n_pairs)
    both = [m.train, m.validation]
    assert sum(s.counts().get("real", 0) for s in both) == want_real
    assert sum(s.counts().get("counterfactual", 0) for s in both) == want_cf
    # 80/20 over units (a real example, or a pair's rows); no pair is split.
    units = want_real + want_cf // 2 + want_cf % 2
    val_units = len(m.validation.groups())
    assert val_units == int(0.2 * units)
    train_pairs = {g for g in m.train.group if g >= 0}
    val_pairs = {g for g in m.validation.group if g >= 0}
    assert not train_pairs & val_pairs
    assert sorted(m.train.group.count(g) for g in train_pairs) == [2] * len(train_pairs)
    assert len(m.heldout_cf) == len(val_pairs)
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


@pytest.fixture(scope="module")
def decorrelation_builds(tmp_path_factory, coco_fixture_dir, nltk_data_dir):
    root = tmp_path_factory.mktemp("builds")
    assert cli_main(["build", "coco-captions", "--coco-root", str(coco_fixture_dir), "--splits",
                     "train", "restval", "val", "test", "--output", str(root / "cc")]) == 0
    assert cli_main(["build", "decorrelation", "--coco-root", str(coco_fixture_dir), "--fill",
                     "zero", "--output", str(root / "dec")]) == 0
    return root / "cc", root / "dec"


@pytest.mark.parametrize("ratio", [0.1, 0.25, None])
def test_decorrelation_ratio_counts_and_pairs(decorrelation_builds, ratio):
    from datasets import load_dataset

    cc, dec = decorrelation_builds
    cfg = DataConfig(real=SourceRef(str(cc)), decorrelation=SourceRef(str(dec)), mix="decorrelation",
                     ratio=ratio)
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
        build_mixture(DataConfig(real=SourceRef(str(cc)), decorrelation=SourceRef(str(dec)),
                                 mix="decorrelation", ratio=5.0))


def test_welch_one_tailed_matches_the_formula(tmp_path):
    """The sweep's p-value equals Welch's t with Welch–Satterthwaite degrees of freedom."""
    from scipy import stats

    from training.sweep import welch_one_tailed

    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 9), rng.normal(0.3, 2.0, 14)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
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


def test_coco_5k_recall_equals_the_eccv_suite_on_the_real_test_split():
    """The trainer's 5-captions-per-image R@K on the real COCO 5K ids (from the annotations
    shipped in eccv_caption) equals the ECCV suite's coco_5k recalls on the same embeddings."""
    from counterfactory_metrics.map_at_r.eccv_annotations import read_positives
    from training.evaluation import EvalData, eccv_metrics, retrieval_metrics

    i2t = read_positives("coco").i2t
    image_ids = np.array(sorted(i2t))
    caption_ids = np.array([c for i in image_ids for c in sorted(i2t[i])])
    owner = np.repeat(image_ids, [len(i2t[i]) for i in image_ids])
    rng = np.random.default_rng(0)
    # Captions near their image, so R@K is far from 0 (and continuous scores: no ties).
    emb = {"image": rng.normal(size=(len(image_ids), 8)).astype(np.float32)}
    emb["text"] = (emb["image"][np.searchsorted(image_ids, owner)]
                   + rng.normal(scale=0.3, size=(len(caption_ids), 8)).astype(np.float32))
    data = EvalData(image_ids=image_ids, caption_ids=caption_ids, caption_image=owner)
    ours, eccv = retrieval_metrics(emb, data, (1, 5, 10)), eccv_metrics(emb, data)
    assert len(image_ids) == 5000 and ours["retrieval/i2t_R@1"] > 0.05
    for k in (1, 5, 10):
        for d in ("i2t", "t2i"):
            assert ours[f"retrieval/{d}_R@{k}"] == pytest.approx(eccv[f"eccv/coco_5k_r{k}_{d}"], abs=1e-9)
