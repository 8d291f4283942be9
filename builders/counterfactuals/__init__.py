"""COCO-Counterfactuals: minimal-edit caption pairs and their Prompt-to-Prompt image pairs
(method: `METHOD.md` beside this file).

Flags (`options.py`) → `CocoCounterfactualsConfig`, the stages, model roles and stage settings
(`config.py`) → COCO captions, a `datasets` text column, or an earlier captions build
(`source.py`) → one noun swapped by a masked LM, similarity and perplexity filters (`captions.py`)
→ candidate image pairs from Stable Diffusion with shared noise and attention injection
(`prompt_to_prompt.py`) → CLIP filters and best directional similarity (`images.py`) → the
`captions` and `default` tables and their column docs (`schema.py`) → card fields (`card.py`) and
gallery view (`view.py`), all driven by `builder.py` (also the `accelerate launch` entry point).
"""
