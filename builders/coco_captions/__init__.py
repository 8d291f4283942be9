"""COCO captions: the real image-caption pairs D that the other datasets are measured against.

Flags (`options.py`) → `CocoCaptionsConfig` (`config.py`) → the COCO records of each Karpathy
split (`source.py`, reading `loading_scripts.coco`) → one `default` row per image with its captions
and boxes, one `captions` row per caption (`schema.py`) → card fields (`card.py`) and gallery view
(`view.py`) → Hub-layout parquet with embedded images, driven by `builder.py` (also the
`accelerate launch` entry point).
"""
