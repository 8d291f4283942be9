"""Floors beside every model of a report: what a number means next to no skill at all.

- `chance_levels`: each metric of a model that ranks at random, in closed form (R@K: an image
  with m of G captions finds one in its top K with probability 1 - C(G - m, K) / C(G, K); a
  caption finds its image among N with K / N; the 1K folds the mean over folds. ODmAP@k:
  `odmap_chance`, the expected AP@k of a random ranking of the gallery. ITM deltas of a model
  without preference: mean 0, median 0, fraction below zero 1/2.) PN: `pn_floor`, from the
  model's own scores, slightly below 0.
- `blind_baseline`: the pairs scored without their images by the builder's language model
  (perplexity: lower is more fluent) and the sentence model (cosine to the set's mean caption
  embedding: higher is more typical): how often each prefers the original caption, with its
  interval (a tie counts one half). `prior_effect`: such a prior cancels in IR_c = G(C_c, I_c) -
  G(C_c, I_o); it can raise TR_c = G(C_c, I_c) - G(C_o, I_c) only where it favours C_c, claimed
  where the interval lies below 50 % (SugarCrepe found such priors in ARO/CREPE hard negatives).
- Same-word pairs: pairs whose two captions are the same multiset of words (a swap, not a
  substitution): counted and scored apart; tables imported with `--captions-from` may hold them.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.statistics import PAGE_CELLS, Interval, UnitScores, intervals
from training.unit_scores import RETRIEVAL, pair_clusters, recall_name

_WORDS = re.compile(r"[\w']+")


def _recall_chance(gallery: int, positives: np.ndarray, k: int) -> float:
    """Mean over queries of P(one of m positives among G is in a random top K)."""
    j = np.arange(min(k, gallery))  # miss: no positive among the first K drawn without replacement
    miss = np.prod(np.maximum(0.0, (gallery - np.asarray(positives)[:, None] - j) / (gallery - j)), axis=1)
    return float(np.mean(1.0 - miss)) if len(positives) else float("nan")


def retrieval_chance(data, k_values) -> dict[str, float]:
    """training.evaluation's R@K keys -> chance level, whole split and COCO 1K folds."""
    out: dict[str, list[float]] = {}
    n = len(data.image_ids)
    for fold, rows in enumerate([np.arange(n), *data.folds]):
        name = RETRIEVAL if fold == 0 else f"{RETRIEVAL}_1k"
        images = data.image_ids[rows]
        per_image = np.array([np.count_nonzero(data.caption_image == i) for i in images])
        for k in k_values:
            i2t, t2i = f"{name}/{recall_name('i2t', k)}", f"{name}/{recall_name('t2i', k)}"
            out.setdefault(i2t, []).append(_recall_chance(int(per_image.sum()), per_image, k))
            out.setdefault(t2i, []).append(min(1.0, k / len(images)))
    return {key: float(np.mean(v)) for key, v in out.items()}


def expected_ap(relevant: np.ndarray, gallery: int, k: int) -> np.ndarray:
    """E[AP@k] of a uniformly random ranking of `gallery` items, `relevant` of them relevant (per
    query), AP@k as the odmap module defines it, (1/k) sum_{i<=k} rel(i) P(i). With p = r/G,
    E[rel(i) P(i)] = (1/i) [P(rel(i)) + sum_{j<i} P(rel(i), rel(j))] = (1/i) [p + (i-1) p (r-1)/(G-1)]
    (two positions of a random permutation: both relevant with p (r-1)/(G-1)); so
    E[AP@k] = (p H_k + p (r-1)/(G-1) (k - H_k)) / k, H_k the k-th harmonic number."""
    r = np.asarray(relevant, dtype=np.float64)
    p = r / gallery
    pair = np.where(r > 1, (r - 1) / max(gallery - 1, 1), 0.0)
    harmonic = float(np.sum(1.0 / np.arange(1, k + 1)))
    return (p * harmonic + p * pair * (k - harmonic)) / k


def relevant_counts(mentions: np.ndarray, removed: np.ndarray, present: np.ndarray) -> np.ndarray:
    """How many gallery captions are correct for each query (the odmap module's relevance, a
    page of queries at a time: memory bounded by PAGE_CELLS)."""
    from counterfactory_metrics.odmap.odmap_scores import relevance_from_mentions

    page = max(1, PAGE_CELLS // max(mentions.size, 1))
    out = np.zeros(len(removed), dtype=np.int64)
    for start in range(0, len(removed), page):
        rows = slice(start, start + page)
        tiled = np.broadcast_to(mentions, (len(removed[rows]), *mentions.shape))
        out[rows] = relevance_from_mentions(tiled, removed[rows], present[rows]).sum(1)
    return out


def odmap_chance(data, k_values) -> dict[str, float]:
    """ODmAP@k of a uniformly random ranking of the gallery: the mean over queries of
    `expected_ap` (closed form, no sampling)."""
    from training.evaluation import class_matrix, odmap_classes

    gallery = len(data.gallery_captions)
    k = min(max(k_values), gallery)
    classes = odmap_classes(data)
    counts = relevant_counts(
        class_matrix(data.gallery_mentions, classes),
        class_matrix(data.removed, classes),
        class_matrix(data.present, classes),
    )
    return {f"odmap/ODmAP@{v}": float(expected_ap(counts, gallery, v).mean()) for v in k_values if v <= k}


def pn_floor(values: list[tuple[int, str, float]]) -> dict[str, float]:
    """PN per removed class and its mean for a model with no preference between x and x', from
    the model's own `(query, class, PN)` values. Without preference (s_x, s_x') is exchangeable,
    so E[PN] is the mean of each value and its swap: with rho = s_x'/s_x = 1 - PN,
    ((1 - rho) + (1 - 1/rho)) / 2 = 1 - (rho + 1/rho)/2, which is <= 0 (Jensen: rho + 1/rho >= 2),
    0 only where s_x = s_x': the floor is slightly negative, not 0."""
    per_class: dict[str, list[float]] = {}
    for _, c, pn in values:
        rho = 1.0 - pn
        per_class.setdefault(c, []).append(1.0 - (rho + 1.0 / rho) / 2 if rho > 0 else float("nan"))
    out = {f"necessity/PN_{c}": float(np.mean(v)) for c, v in sorted(per_class.items())}
    if values:
        out["necessity/PN_mean"] = float(np.mean([v for vs in per_class.values() for v in vs]))
    return out


def chance_levels(
    metrics: dict[str, float], data, k_values, pn_values: list[tuple[int, str, float]] | None = None
) -> dict[str, float]:
    """Chance level of every metric of `metrics` that has one (training.evaluation's keys); PN's
    from the model's `pn_values` (`pn_floor`)."""
    out: dict[str, float] = {}
    if data.retrieval is not None:
        out.update(retrieval_chance(data, k_values))
    if data.queries is not None and any(k.startswith("odmap/") for k in metrics):
        out.update(odmap_chance(data, k_values))
    for key in metrics:
        task, _, name = key.partition("/")
        if task == "itm":
            out[key] = 0.5 if name.endswith("frac_below_zero") else 0.0
    out.update(pn_floor(pn_values or []))
    return {k: v for k, v in out.items() if k in metrics}


def prior_effect(prefers_original: float | None, low: float | None = None, high: float | None = None) -> str:
    """Which ITM delta a text-only prior with this preference could inflate (module docstring):
    never IR_c; TR_c only where the prior favours the counterfactual caption. A direction is
    claimed only where the 95 % interval [low, high] excludes 0.5."""
    if prefers_original is None or np.isnan(prefers_original):
        return "n/a"
    if low is None or high is None or low <= 0.5 <= high:
        return "none shown (" + ("no interval" if low is None or high is None else "its interval holds 0.5") + ")"
    if high < 0.5:
        return "TR_c (the prior favours the counterfactual caption)"
    return "none (the prior favours the original caption: it lowers TR_c)"


def same_words(a: str, b: str) -> bool:
    """Whether two captions are the same multiset of words (case and punctuation aside)."""
    return Counter(_WORDS.findall(a.lower())) == Counter(_WORDS.findall(b.lower()))


def _prefers(original: np.ndarray, counterfactual: np.ndarray, higher: bool) -> np.ndarray:
    """1 where a score prefers the original caption, 0 the counterfactual, 1/2 a tie or NaN."""
    better = original > counterfactual if higher else original < counterfactual
    worse = original < counterfactual if higher else original > counterfactual
    return np.where(better, 1.0, np.where(worse, 0.0, 0.5))


def caption_pairs(data) -> tuple[list[str], list[str]]:
    """(original, counterfactual) caption of every held-out counterfactual pair."""
    ex = data.cf_pairs
    pairs = ex.tables[ex.table_of[0]].select_columns(["caption_0", "caption_1"])
    rows = ex.row[0::2]
    return [pairs[r]["caption_0"] for r in rows], [pairs[r]["caption_1"] for r in rows]


@dataclass
class BlindModels:
    """The blind baseline's text models, loaded once per report (a renderings dataset scores
    each generator's pairs with them), and the weights digest of each (`lm`, `sentence`)."""

    lm: Any
    tokenizer: Any
    sentence: Any
    digests: dict[str, str]


def load_blind_models(lm_id: str, sentence_id: str) -> BlindModels:
    from builders.models.loaders import load_lm, load_sentence
    from training.report.models import weights_digest

    lm, tok = load_lm(lm_id)
    sentence = load_sentence(sentence_id)
    return BlindModels(lm, tok, sentence, {"lm": weights_digest(lm), "sentence": weights_digest(sentence)})


def blind_scores(originals: list[str], counterfactuals: list[str], models: BlindModels) -> dict[str, np.ndarray]:
    """Per pair, whether the LM and the sentence model prefer the original (`_prefers`)."""
    import torch

    from builders.counterfactuals.captions import CaptionModels, lm_perplexities

    lm, tok = models.lm, models.tokenizer
    limit = CaptionModels(None, None, lm, tok, None).lm_limit()
    ppl = np.asarray(lm_perplexities(lm, tok, originals + counterfactuals, 32, limit))
    n = len(originals)
    emb = models.sentence.encode(originals + counterfactuals, convert_to_tensor=True, show_progress_bar=False)
    emb = torch.nn.functional.normalize(emb.float(), dim=-1)
    typical = (emb @ torch.nn.functional.normalize(emb.mean(0), dim=0)).cpu().numpy()
    return {
        "lm_prefers_original": _prefers(ppl[:n], ppl[n:], higher=False),
        "sentence_prefers_original": _prefers(typical[:n], typical[n:], higher=True),
    }


def blind_baseline(data, models: BlindModels, resamples: int, seed: int) -> dict:
    """The blind baseline of the counterfactual set (module docstring): per model, the fraction
    of pairs where it prefers the original, its interval, and the same on the same-word pairs and
    on the others; the same-word pair count; each text model's weights digest."""
    originals, counterfactuals = caption_pairs(data)
    same = np.asarray([same_words(a, b) for a, b in zip(originals, counterfactuals, strict=True)], dtype=float)
    prefers = blind_scores(originals, counterfactuals, models)
    units: dict[str, UnitScores] = {}
    clusters = pair_clusters(data.cf_pairs)  # pairs of one source image go together
    for name, values in prefers.items():
        for part, den in ((name, None), (f"{name}_same_words", same), (f"{name}_other_pairs", 1 - same)):
            num = values if den is None else values * den
            units[part] = UnitScores("counterfactual pairs", num, den, clusters=clusters, proportion=True)
    metrics = {name: u.value() for name, u in units.items()}
    return {
        "metrics": {**metrics, "same_word_pairs": float(same.sum()), "pairs": float(len(same))},
        # n: the pairs each fraction is over (the same-word pairs' is their count), also without resamples.
        "intervals": intervals(units, resamples, seed)
        if resamples
        else {name: Interval(np.nan, np.nan, "none", *u.counted()) for name, u in units.items()},
        "digests": models.digests,
    }
