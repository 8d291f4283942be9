"""Helpers shared by several test files (not tests themselves; `tests/` is on pytest's path via
pyproject's `pythonpath`, so a test imports them as `helpers.NAME`).

    browser_helpers.py     waiting for the gallery page, its images, its console errors (Selenium)
    build_helpers.py       tiny fixture builds, shard digests, `accelerate launch` commands
    gallery_helpers.py     the gallery tests' tiny builds, `show`, page records, one-line errors
    hostile_datasets.py    someone else's dataset folder (no build, no view) for the safety tests
    eccv_mitl_fixtures.py  ECCV MITL answers and no-model fixtures (a pytest plugin: conftest.py)
    reference_odmap.py     a from-the-paper ODmAP / class-match reference implementation
    toy_builder.py         a toy sharded builder, also run as a script under `accelerate launch`
    training_helpers.py    colour datasets, counterfactual sets and metric readers for training
"""
