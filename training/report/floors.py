"""Floors beside every model of a report: what a number means next to no skill at all.

- `chance_levels`: each metric of a model that ranks at random, in closed form where one exists
  (R@K: an image with m of G captions finds one in its top K with probability
  1 - C(G - m, K) / C(G, K); a caption finds its image among N with K / N; the 1K folds the mean
  over folds. ITM deltas of a model without preference: mean 0, median 0, fraction below zero
  1/2; PN 0), else by permuting the rankings (ODmAP@k: the mean over `PERMUTATIONS` random
  rankings of the gallery, scored by the odmap module).
- `blind_baseline`: the counterfactual pairs scored without their images. The builder's own
  language model (the perplexity filter that chose the captions: gpt2-large in production) and
  the sentence model each score every caption alone: the LM by its perplexity (lower: more
  fluent), the sentence model by its cosine to the mean embedding of all the set's captions
  (higher: more typical of them). Reported: how often each prefers the original caption (with
  its bootstrap interval over pairs; a tie or an unscorable caption counts one half). Near 50 %,
  the captions alone do not give the pair away; far from it, a model can score above chance on
  IR_c/TR_c from the text alone (as SugarCrepe found for ARO/CREPE hard negatives).
- Same-word pairs: pairs whose two captions are the same multiset of words (a swap, not a
  substitution): counted and scored apart; tables imported with `--captions-from` may hold them.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.statistics import UnitScores, bootstrap, interval
from training.unit_scores import RETRIEVAL, recall_name

#: Random rankings averaged for the chance level of ODmAP@k.
PERMUTATIONS = 20
_WORDS = re.compile(r"[\w']+")


def _recall_chance(gallery: int, positives: np.ndarray, k: int) -> float:
    """Mean over queries of P(one of m positives among G is in a random top K)."""
    out = []
    for m in positives:
        miss = 1.0
        for j in range(min(k, gallery)):
            miss *= max(0.0, (gallery - m - j) / (gallery - j))
        out.append(1.0 - miss)
    return float(np.mean(out)) if out else float("nan")


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


def odmap_chance(data, k_values, seed: int = 0) -> dict[str, float]:
    """ODmAP@k of random gallery rankings, mean over `PERMUTATIONS` of them."""
    from counterfactory_metrics.odmap.odmap_scores import odmap_from_topk
    from training.evaluation import class_matrix, odmap_classes

    gallery = len(data.gallery_captions)
    k = min(max(k_values), gallery)
    ks = [v for v in k_values if v <= k]
    classes = odmap_classes(data)
    mentions = class_matrix(data.gallery_mentions, classes)
    removed, present = class_matrix(data.removed, classes), class_matrix(data.present, classes)
    rng = np.random.default_rng(seed)
    sums = dict.fromkeys(ks, 0.0)
    for _ in range(PERMUTATIONS):
        top = np.argsort(rng.random((len(data.removed), gallery)), axis=1)[:, :k]
        for key, value in odmap_from_topk(top, mentions, removed, present, k_values=ks).scores.items():
            sums[key] += value / PERMUTATIONS
    return {f"odmap/ODmAP@{key}": v for key, v in sums.items()}


def chance_levels(metrics: dict[str, float], data, k_values) -> dict[str, float]:
    """Chance level of every metric of `metrics` that has one (training.evaluation's keys)."""
    out: dict[str, float] = {}
    if data.retrieval is not None:
        out.update(retrieval_chance(data, k_values))
    if data.queries is not None and any(k.startswith("odmap/") for k in metrics):
        out.update(odmap_chance(data, k_values))
    for key in metrics:
        task, _, name = key.partition("/")
        if task == "itm":
            out[key] = 0.5 if name.endswith("frac_below_zero") else 0.0
        elif task == "necessity":
            out[key] = 0.0
    return {k: v for k, v in out.items() if k in metrics}


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
    for name, values in prefers.items():
        units[name] = UnitScores("counterfactual pairs", values)
        units[f"{name}_same_words"] = UnitScores("counterfactual pairs", values * same, same)
        units[f"{name}_other_pairs"] = UnitScores("counterfactual pairs", values * (1 - same), 1 - same)
    resampled = bootstrap(units, resamples, seed) if resamples else {}
    metrics = {name: u.value() for name, u in units.items()}
    intervals = {name: (*interval(resampled[name]), u.n) for name, u in units.items()} if resamples else {}
    return {
        "metrics": {**metrics, "same_word_pairs": float(same.sum()), "pairs": float(len(same))},
        "intervals": intervals,
        "digests": models.digests,
    }
