"""Shared machinery of every builder: the `counterfactory` CLI (`cli.py`), the sharded resumable
runner (`sharding/`), publishing and cards (`publishing/`), the local Hub (`local_hub.py`), model
profiles and loaders (`models/`), NLTK and noun phrases (`text/`), fixtures (`fixtures/`),
process set-up (`distributed.py`, `seeding.py`), user-facing errors (`errors.py`) and the demo.
"""
