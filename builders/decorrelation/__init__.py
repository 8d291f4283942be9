"""Object-decorrelation sets: images with co-occurring object classes removed, for training and
for the ODmAP@k test (method: `METHOD.md` beside this file).

Flags (`options.py`) → `DecorrelationConfig` and the source, selection, fill, check and caption
settings (`config.py`) → COCO/Flickr30k records (`source.py`) → which classes to remove from which
image (`selection.py`) → fill the removed region (`fill.py`) → check the class is gone
(`verify.py`) → synthetic caption y' (`captions.py`) → three tables, `default/train`,
`odmap_queries/test`, `odmap_gallery/test` (`schema.py`) → card fields (`card.py`) and gallery
view (`view.py`), all driven by `builder.py` (also the `accelerate launch` entry point).
"""
