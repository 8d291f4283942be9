"""COCO-Counterfactuals throughput: batched stages vs one-at-a-time baselines, same outputs.

Caption stage (builders/counterfactuals/METHOD.md §1): `CaptionStage` (one MLM forward per caption batch, one sentence encode
and one padded LM forward for all candidates) against a faithful re-statement of the published
generator, which runs the fill-mask pipeline per noun, encodes each candidate alone and scores
each candidate's perplexity alone. Same models (tiny MLM / GPT-2, the real all-MiniLM-L6-v2),
same captions (the fixture's), and the chosen counterfactuals are asserted equal.

Image stage (builders/counterfactuals/METHOD.md §2): candidate pairs per second with `--candidate-batch N` against one pair
per UNet call, tiny Stable Diffusion; the selected pair is asserted identical.

Run: `python benchmarks/counterfactuals.py [--captions N] [--candidates N] [--steps N]`.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CAPTION_PAIR = ("A man riding a brown horse.", "A man riding a brown elephant.")


def baseline_counterfactual(caption: str, models, unmasker, cfg) -> tuple[str, float] | None:
    """The published generator's loop, one candidate at a time (plus the project's drop of
    candidates equal to the original word, and its in-place edit of the original string)."""
    import nltk
    from sentence_transformers import util

    from builders.counterfactuals.captions import edit_at, token_spans

    tokens = nltk.word_tokenize(caption, preserve_line=True)
    spans = token_spans(caption, tokens)
    positions = [i for i, (_, t) in enumerate(nltk.pos_tag(tokens)) if t in cfg.noun_tags]
    pool = []
    for i in positions:
        masked = list(tokens)
        masked[i] = unmasker.tokenizer.mask_token
        for proposal in unmasker(" ".join(masked), top_k=cfg.top_k):
            word = nltk.word_tokenize(proposal["sequence"], preserve_line=True)
            if len(word) != len(tokens) or word[i].lower() == tokens[i].lower():
                continue
            sentence = edit_at(caption, spans[i], word[i])
            cand = nltk.word_tokenize(sentence, preserve_line=True)
            if (len(cand) == len(tokens) and cand[i] == word[i]
                    and nltk.pos_tag(cand)[i][1] in cfg.replacement_tags and sentence not in pool):
                pool.append(sentence)
    original = models.sentence.encode(caption, convert_to_tensor=True)
    best = None
    for sentence in pool:
        sim = util.cos_sim(original, models.sentence.encode(sentence, convert_to_tensor=True)).item()
        if not cfg.sim_low < sim <= cfg.sim_high:
            continue
        ids = models.lm_tokenizer(sentence, return_tensors="pt").input_ids
        if ids.shape[1] < 2:
            continue
        with torch.no_grad():
            ppl = math.exp(models.lm(ids, labels=ids).loss.item())
        if best is None or ppl < best[1]:
            best = (sentence, ppl)
    return best


def bench_captions(profile, n_captions: int) -> dict:
    from transformers import pipeline

    from builders.counterfactuals.captions import CaptionModels, CaptionStage, CaptionStageConfig
    from builders.infra.fixtures.scenes import SCENES

    captions = [c for scene in SCENES for c in scene.captions]
    captions = (captions * math.ceil(n_captions / len(captions)))[:n_captions]
    models = CaptionModels.load(profile.mlm, profile.lm, profile.sentence)
    cfg = CaptionStageConfig()
    unmasker = pipeline("fill-mask", model=models.mlm, tokenizer=models.mlm_tokenizer)
    stage = CaptionStage(models, cfg)
    stage.run(captions[:4])  # warm-up, both paths share the models
    baseline_counterfactual(captions[0], models, unmasker, cfg)

    start = time.perf_counter()
    ours = stage.run(captions)
    t_ours = time.perf_counter() - start
    # The reference's order (what `auto` picks for production-size LMs), for comparison.
    start = time.perf_counter()
    sim_first = CaptionStage(models, CaptionStageConfig(order="similarity_first")).run(captions)
    t_sim_first = time.perf_counter() - start
    start = time.perf_counter()
    base = [baseline_counterfactual(c, models, unmasker, cfg) for c in captions]
    t_base = time.perf_counter() - start
    for caption, a, b, c in zip(captions, ours, base, sim_first):
        assert (None if isinstance(a, str) else a.counterfactual) == (b and b[0]), caption
        assert getattr(a, "counterfactual", a) == getattr(c, "counterfactual", c), caption
    kept = sum(not isinstance(a, str) for a in ours)
    return {"captions": len(captions), "pairs": kept, "ours_s": t_ours, "baseline_s": t_base,
            "order": stage.order, "sim_first_s": t_sim_first,
            "ours_per_s": len(captions) / t_ours, "baseline_per_s": len(captions) / t_base,
            "speedup": t_base / t_ours}


def bench_images(profile, candidates: int, steps: int, batch: int) -> dict:
    import numpy as np

    from builders.counterfactuals.config import ImageStageConfig
    from builders.counterfactuals.images import ClipScorer, ImageStage
    from builders.infra.models.loaders import load_clip, load_sd

    pipe = load_sd(profile.sd)
    scorer = ClipScorer(*load_clip(profile.clip_filter))
    results, times = {}, {}
    for b in (batch, 1):
        cfg = ImageStageConfig(candidates=candidates, candidate_batch=b, steps=steps, image_size=64,
                               clip_threshold=-1.0, image_similarity_threshold=-1.0,
                               directional_threshold=-1.0)
        stage = ImageStage(pipe, scorer, cfg, seed=0)
        stage.run("warmup", *CAPTION_PAIR)
        start = time.perf_counter()
        results[b] = stage.run("bench", *CAPTION_PAIR)
        times[b] = time.perf_counter() - start
    a, b = results[batch].pair, results[1].pair
    assert a.seed == b.seed and np.array_equal(np.asarray(a.image_1), np.asarray(b.image_1))
    return {"candidates": candidates, "steps": steps, "batch": batch,
            "batched_pairs_per_s": candidates / times[batch], "single_pairs_per_s": candidates / times[1],
            "speedup": times[1] / times[batch]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captions", type=int, default=66, help="captions (fixture ones, cycled)")
    parser.add_argument("--candidates", type=int, default=16, help="image candidate pairs")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps")
    parser.add_argument("--candidate-batch", type=int, default=8)
    parser.add_argument("--tiny-models-dir", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("NLTK_DATA", str(REPO / ".nltk_data"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from builders.infra.models.profiles import resolve_profile
    from builders.infra.text.nltk_setup import install_offline_tagger

    try:
        import nltk

        nltk.data.find("taggers/averaged_perceptron_tagger_eng/")
    except LookupError:
        install_offline_tagger(os.environ["NLTK_DATA"])
    profile = resolve_profile("tiny", args.tiny_models_dir)
    cap = bench_captions(profile, args.captions)
    print(f"caption stage: {cap['captions']} captions -> {cap['pairs']} pairs (same choices)")
    print(f"  batched  {cap['ours_per_s']:8.2f} captions/s ({cap['ours_s']:.1f} s, order {cap['order']})")
    print(f"  batched  {cap['captions'] / cap['sim_first_s']:8.2f} captions/s "
          f"({cap['sim_first_s']:.1f} s, order similarity_first)")
    print(f"  baseline {cap['baseline_per_s']:8.2f} captions/s ({cap['baseline_s']:.1f} s)")
    print(f"  speed-up {cap['speedup']:.1f}x "
          f"({cap['baseline_s'] / cap['sim_first_s']:.1f}x similarity first)")
    img = bench_images(profile, args.candidates, args.steps, args.candidate_batch)
    print(f"image stage: {img['candidates']} candidate pairs, {img['steps']} steps, 64x64 (same pair)")
    print(f"  batch {img['batch']:<3d} {img['batched_pairs_per_s']:8.2f} pairs/s")
    print(f"  batch 1   {img['single_pairs_per_s']:8.2f} pairs/s")
    print(f"  speed-up {img['speedup']:.1f}x")


if __name__ == "__main__":
    main()
