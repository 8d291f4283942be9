"""Object-decorrelation sets: images with co-occurring object classes removed, for training and
for the ODmAP@k test (method: `METHOD.md` beside this file).

COCO/Flickr30k source (`source.py`) → which classes to remove from which image (`selection.py`)
→ fill the removed region (`fill.py`) → synthetic caption y' (`captions.py`) → three tables,
`default/train`, `odmap_queries/test`, `odmap_gallery/test` (`schema.py`), driven by `builder.py`
and described by a generated card (`card.py`); `view.py` says how the gallery shows the rows.
"""
