"""The application layer: the `counterfactory` command line and the demo.

    cli.py          the subcommand table and `main`
    registry.py     `counterfactory build <dataset>`: the table of builders
    demo.py         `make demo`: fixture -> every build -> local Hub -> metrics -> gallery
    *_cli.py        one subcommand each (fixtures, models, nltk, publish, metric, local-hub, show)

Everything below is importable without it (tests/house/test_layers.py).
"""
