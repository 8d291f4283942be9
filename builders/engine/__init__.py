"""The build engine, the bottom layer every other part of counterfactory stands on.

    sharding/          the sharded, resumable runner: parts -> shards + build manifest
    errors.py          user-facing errors (one line, exit 2) and `run_handled`
    distributed.py     the process group (accelerate / torchrun / job arrays)
    progress.py        progress bars and ETA log lines
    seeding.py         per-item seeds that do not depend on the process count
    provenance.py      portable names of models and sources (no local path is ever published)
    contained_paths.py paths named by data resolved inside the declared root
    dataset_source.py  one split of a local build or a Hub dataset, with friendly errors
    nltk_setup.py      NLTK data (offline tagger trained on `resources/`) and noun phrases
    option_types.py    argparse types shared by every command
    options.py         flags generated from typed config fields (`option()`), and presets
    repo_paths.py      the file paths a Hub repo refuses

It imports nothing above it (tests/house/test_layers.py declares the layers).
"""
