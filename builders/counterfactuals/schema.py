"""The COCO-Counterfactuals tables: `captions` (caption pairs) and `default` (image pairs with the
original release's columns plus provenance), and what each column means."""

from __future__ import annotations

import datasets

from builders.counterfactuals.config import IMAGE_FILTERS

_STRING, _FLOAT, _INT = datasets.Value("string"), datasets.Value("float64"), datasets.Value("int32")
CAPTION_FEATURES = datasets.Features(
    {
        "id": _STRING,
        "caption_0": _STRING,
        "caption_1": _STRING,
        "source": _STRING,
        "source_id": _STRING,
        "source_image_id": _STRING,
        "replaced_word": _STRING,
        "replacement_word": _STRING,
        "replaced_position": _INT,
        "similarity": _FLOAT,
        "perplexity": _FLOAT,
        "caption_candidates": _INT,
        "caption_candidates_in_window": _INT,
        "human_substitution": datasets.Value("bool"),
        "mlm_model": _STRING,
        "lm_model": _STRING,
        "sentence_model": _STRING,
    }
)
PAIR_FEATURES = datasets.Features(
    {
        "id": _STRING,
        "image_0": datasets.Image(),
        "image_1": datasets.Image(),
        **{k: v for k, v in CAPTION_FEATURES.items() if k != "id"},
        "seed": datasets.Value("int64"),
        "p": _FLOAT,
        "guidance_scale": _FLOAT,
        "clip_score_0": _FLOAT,
        "clip_score_1": _FLOAT,
        "clip_directional": _FLOAT,
        "clip_image_similarity": _FLOAT,
        "image_candidates_tried": _INT,
        "image_candidates_passed": _INT,
        **{f"image_rejected_{name}": _INT for name in IMAGE_FILTERS},
        "sd_model": _STRING,
        "clip_model": _STRING,
        "generator": _STRING,
        "generation_method": _STRING,
        "steps": _INT,
        "resolution": _INT,
    }
)
#: The generation columns of `PAIR_FEATURES` that only a generated row has (null when imported).
GENERATION_COLUMNS = ("generator", "generation_method", "steps", "resolution")
COLUMN_DOCS = {
    "id": "`<coco image id>_<caption index>` (COCO) or the source row id",
    "image_0": "synthetic image of caption_0",
    "image_1": "synthetic image of caption_1",
    "caption_0": "original caption",
    "caption_1": "counterfactual caption (one noun swapped)",
    "source": "source dataset",
    "source_id": "source caption id (COCO annotation id)",
    "source_image_id": "source image id",
    "replaced_word": "noun of caption_0 that was swapped",
    "replacement_word": "its replacement",
    "replaced_position": "character offset of the swap, the same in both captions: caption_0 and "
    "caption_1 are identical except that `replaced_word` starts there in "
    "caption_0 and `replacement_word` in caption_1",
    "similarity": "all-MiniLM cosine of the captions",
    "perplexity": "LM perplexity of caption_1",
    "caption_candidates": "candidates after the length/noun filter",
    "caption_candidates_in_window": "candidates inside the similarity window (null when scored "
    "perplexity first, which stops at the first one)",
    "human_substitution": "the swap touches the human taxonomy (girl, man, people, ...)",
    "seed": "seed of the chosen candidate",
    "p": "Prompt-to-Prompt injection fraction",
    "guidance_scale": "classifier-free guidance",
    "clip_score_0": "CLIP cos(caption_0, image_0)",
    "clip_score_1": "CLIP cos(caption_1, image_1)",
    "clip_directional": "CLIP directional similarity",
    "clip_image_similarity": "CLIP cos(image_0, image_1)",
    "image_candidates_tried": "candidate pairs generated",
    "sd_model": "the generator's model, Hub id@commit (or local:NAME@sha256)",
    "clip_model": "the CLIP model of the image filters",
    "generator": "the image generator (`--generator`: sd15, sdxl, sd3, flux)",
    "generation_method": "how the twin image was drawn: prompt-to-prompt-instruct-pix2pix/self (the "
    "instruct-pix2pix generator's self-attention copy, Brooks et al. 2023), prompt-to-prompt/cross or "
    "/both (Hertz et al. 2022's word swap), or stable-flow-vital-layers (Avrahami et al., CVPR 2025)",
    "steps": "denoising steps",
    "resolution": "image side in pixels",
    "image_candidates_passed": "of which passed every image filter",
    **{
        f"image_rejected_{name}": f"candidates that failed the {name} filter (a candidate can fail "
        "several; null when the filter was off)"
        for name in IMAGE_FILTERS
    },
}
