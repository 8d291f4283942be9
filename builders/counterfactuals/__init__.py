"""COCO-Counterfactuals: minimal-edit caption pairs and their Prompt-to-Prompt image pairs
(method: `METHOD.md` beside this file).

COCO captions → one noun swapped by a masked LM, similarity and perplexity filters
(`captions.py`) → candidate image pairs from Stable Diffusion with shared noise and attention
injection (`prompt_to_prompt.py`) → CLIP filters and best directional similarity (`images.py`)
→ `captions` and `default` tables, driven by `builder.py`; `view.py` says how the gallery shows
the `default` rows.
"""
