"""Helpers shared by several test files (not tests themselves; `tests/` is on pytest's path via
pyproject's `pythonpath`, so a test imports them as `helpers.NAME`).

    browser_helpers.py     waiting for the gallery page, its images, its console errors (Selenium)
    build_helpers.py       tiny fixture builds, shard digests, rows per output, `accelerate launch`
    decorrelation_fixtures.py  the raw fixture JSON as tests read it, build flags, Flickr30k Entities
    gallery_helpers.py     the gallery tests' tiny builds, `show`, page records, one-line errors
    hostile_datasets.py    someone else's dataset folder (no build, no view) for the safety tests
    eccv_fixtures.py       the real ECCV annotations read with json, a COCO root of their images
    eccv_mitl_fixtures.py  ECCV MITL answers and no-model fixtures (a pytest plugin: conftest.py)
    publish_helpers.py     toy builds to publish, one-line errors, the tree a tag should hold
    reference_odmap.py     a from-the-paper ODmAP / class-match reference implementation
    selection_reference.py a brute-force reading of the decorrelation selection rules
    toy_builder.py         a toy sharded builder, also run as a script under `accelerate launch`
    training_helpers.py    colour datasets, counterfactual sets and metric readers for training
"""
