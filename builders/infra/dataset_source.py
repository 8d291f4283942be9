"""Read one split of any `datasets` source (a Hub id or a local folder) chosen on the command line.

`datasets.load_dataset` answers a wrong config or split with a raw `ValueError` traceback
(`Unknown split "train"`). Here the configs and splits are looked up first, so a wrong choice is
one line that lists what exists and names the flags that pick it.
"""

from __future__ import annotations

from builders.infra.errors import InputFileError


def load_dataset_split(name: str, config: str | None, split: str, *,
                       config_flag: str = "--dataset-config", split_flag: str = "--dataset-split"):
    import datasets

    try:
        configs = datasets.get_dataset_config_names(name)
    except (OSError, ValueError) as err:  # not found (FileNotFoundError), no network (ConnectionError)
        raise InputFileError(name, f"cannot open this dataset ({type(err).__name__}: {err})",
                             "give a Hub id ORG/NAME or a local dataset folder") from None
    if config is None and len(configs) > 1 and "default" not in configs:
        raise InputFileError(name, f"has several configs ({', '.join(configs)})",
                             f"pick one with {config_flag} NAME")
    if config is not None and config not in configs:
        raise InputFileError(name, f"has no config {config!r} (configs: {', '.join(configs)})",
                             f"pick one with {config_flag} NAME")
    chosen = config or ("default" if "default" in configs else configs[0])
    splits = datasets.get_dataset_split_names(name, chosen)
    if split not in splits:
        available = "; ".join(f"{c}: {', '.join(datasets.get_dataset_split_names(name, c))}"
                              for c in configs)
        raise InputFileError(name, f"config {chosen!r} has no split {split!r} (splits by config: "
                             f"{available})", f"pick them with {config_flag} NAME {split_flag} SPLIT")
    return datasets.load_dataset(name, config, split=split)
