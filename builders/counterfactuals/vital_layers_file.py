"""`--vital-layers-from JSON`: the measurement `counterfactory doctor vital-layers` wrote
(builders/devtools/vital_layers.py), read and checked before any build work starts.

The file is bounded before it is parsed (`MAX_BYTES`) and after (`MAX_DEPTH` of nesting,
`MAX_TEXT` characters per string): its provenance goes into the manifest and the card. The
layers are JSON integers (not booleans), each a block of the measured model, each once.

The measurement is of one model: its identity is the JSON's `generator`, `blocks` (the block
names, `block_names`), `provenance.model` / `provenance.revision` (as
`builders.engine.provenance.model_name` names the model) and `provenance.config_sha256` (the
sha256 of its denoiser's `transformer/config.json`, canonical JSON: `config_sha256`), so a tiny
or fine-tuned model of the same name and depth is still another model. It must be the model the build
loads: `MUST_MATCH` lists the fields whose difference is refused, `SHOULD_MATCH` those only
warned about (a Hub commit moves with any edit of the repository, weights or not). A field
either side does not know (None) is not compared, so a field added to both identities (a
config hash) needs only an entry here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from builders.engine.errors import InputFileError

log = logging.getLogger(__name__)

#: A measurement of FLUX's 57 blocks with 64 prompts is ~10 KB; anything near this is not one.
MAX_BYTES = 1 << 20
#: The JSON's deepest value is a prompt in `provenance.prompts` (depth 3).
MAX_DEPTH = 8
#: Characters of any one string (a Hub id, a revision, a prompt: FLUX's T5 reads 512 tokens).
MAX_TEXT = 4096


#: The model each published list was measured on (builders/counterfactuals/METHOD.md §6):
#: Stable Flow's FLUX list on FLUX.1-dev; SD3's list has no measurement (unmeasured everywhere).
PUBLISHED_ON = {"flux": "black-forest-labs/FLUX.1-dev"}


def published_elsewhere(generator_name: str, model: str | None) -> str | None:
    """What the manifest, card and log say where a build injects the published list into a
    model other than the one it was measured on (`model`: the build's known model, None: an
    unknown variant); None where it is that model, or where no list was measured."""
    measured = PUBLISHED_ON.get(generator_name)
    if measured is None or (model or "").casefold() == measured.casefold():
        return None
    other = model or f"an unknown {generator_name} variant"
    return f"measured on {measured}, applied here to {other}, on which it was not measured"


def _same_model(a: str, b: str) -> bool:
    """Hub ids resolve in any case; a local model (`local:NAME`) is its folder's name."""
    if a.startswith("local:") or b.startswith("local:"):
        return a == b
    return a.casefold() == b.casefold()


MUST_MATCH: dict[str, Callable[[Any, Any], bool]] = {
    "generator": operator.eq,
    "model": _same_model,
    "blocks": operator.eq,
    "config_sha256": operator.eq,
}
SHOULD_MATCH: dict[str, Callable[[Any, Any], bool]] = {"revision": operator.eq}


def _refuse(path: str, problem: str, fix: str = "") -> InputFileError:
    return InputFileError(f"--vital-layers-from {path}", problem, fix)


def read_vital_layers(path: str, generator_name: str, model: str | None) -> dict[str, Any]:
    """`vital_layers` and `vital_layers_provenance` from the JSON at `path`, checked against the
    generator and `model` (the spec the build loads; None: no model is loaded, the file is
    checked alone). The path itself is not recorded (the provenance says what was measured)."""
    data = _load(path)
    recorded = _recorded_identity(path, data)
    layers = _layers(path, data.get("vital_layers"), len(recorded["blocks"]))
    check_identity(path, recorded, {"generator": generator_name}, model)  # before reading the model
    if model is not None:
        check_identity(path, recorded, loaded_identity(generator_name, model, path), model)
    return {"vital_layers": layers, "vital_layers_provenance": data["provenance"]}


def _load(path: str) -> dict[str, Any]:
    """The parsed file, bounded in size (read at most `MAX_BYTES` + 1) and nesting."""
    fix = "give the JSON `counterfactory doctor vital-layers` wrote"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise _refuse(path, f"cannot be read ({e.strerror or e})", fix) from e
    if len(raw) > MAX_BYTES:
        raise _refuse(path, f"is larger than {MAX_BYTES // 1024} KiB, more than a measurement holds", fix)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError as e:
        raise _refuse(path, f"nests deeper than {MAX_DEPTH} levels", fix) from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int of > 4300 digits
        raise _refuse(path, f"is not JSON ({str(e)[:200]})", fix) from e
    if not isinstance(data, dict):
        raise _refuse(path, f"holds a {type(data).__name__}, not a measurement's object", fix)
    _check_bounds(path, data)
    return data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON knows")


def _check_bounds(path: str, data: Any) -> None:
    """Every value at most `MAX_DEPTH` deep and every string (keys too) at most `MAX_TEXT`
    characters; iterative, as the manifest and card writers that read it later recurse."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _refuse(path, f"nests deeper than {MAX_DEPTH} levels", "give the JSON the doctor wrote")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for item in value.items() for v in item)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise _refuse(
                path,
                f"holds a string of {len(value):,} characters (at most {MAX_TEXT:,})",
                "give the JSON the doctor wrote",
            )


def _layers(path: str, layers: Any, blocks: int) -> tuple[int, ...]:
    """The layers: a non-empty list of distinct JSON integers (`true` is not 1), each a block
    of the measured model (0 <= i < blocks)."""
    fix = f"a list of distinct block indices 0..{blocks - 1}, as `counterfactory doctor vital-layers` writes"
    if not isinstance(layers, list) or not layers:
        raise _refuse(path, f"`vital_layers` is {_show(layers)}, not a non-empty list", fix)
    wrong = [i for i in layers if type(i) is not int or not 0 <= i < blocks]
    if wrong:
        raise _refuse(path, f"`vital_layers` holds {_show(wrong[0])}, not a block index 0..{blocks - 1}", fix)
    if len(set(layers)) != len(layers):
        twice = next(i for i, n in Counter(layers).items() if n > 1)
        raise _refuse(path, f"`vital_layers` lists block {twice} more than once", fix)
    return tuple(layers)


def _show(value: Any) -> str:
    """A value from the file in a message: as JSON, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _recorded_identity(path: str, data: dict[str, Any]) -> dict[str, Any]:
    """The measured model's identity (module docstring); a file without it is refused."""
    provenance, blocks = data.get("provenance"), data.get("blocks")
    model = provenance.get("model") if isinstance(provenance, dict) else None
    typed = (
        isinstance(data.get("generator"), str)
        and isinstance(model, str)
        and isinstance(provenance.get("revision"), (str, type(None)))
        and isinstance(provenance.get("config_sha256"), (str, type(None)))
        and isinstance(provenance.get("dino_model"), str)
        and type(provenance.get("k")) is int
        and provenance["k"] >= 1
        and isinstance(blocks, list)
        and bool(blocks)
        and all(isinstance(b, str) for b in blocks)
    )
    if not typed:
        raise _refuse(
            path,
            "records no measured model (`generator`, `blocks` and `provenance` with its `model`, "
            "`revision`, `dino_model` and `k`)",
            "measure it with `counterfactory doctor vital-layers --generator-model MODEL`, or give "
            "the list with --vital-layers",
        )
    return {
        "generator": data["generator"],
        "model": model,
        "revision": provenance.get("revision"),
        "config_sha256": provenance.get("config_sha256"),
        "blocks": blocks,
    }


def read_denoiser_config(model: str) -> dict[str, Any]:
    """`model`'s `transformer/config.json` (a local folder, or the Hub's file: a build downloads
    it anyway); raises OSError / ValueError where it cannot be read."""
    local = Path(model).expanduser()
    if local.is_dir():
        text = (local / "transformer" / "config.json").read_text()
    elif local.exists() or model.startswith(("/", ".", "~")):
        raise FileNotFoundError(f"{model} is not a model folder")
    else:
        from huggingface_hub import hf_hub_download

        repo, _, revision = model.partition("@")
        text = Path(hf_hub_download(repo, "transformer/config.json", revision=revision or None)).read_text()
    config = json.loads(text)
    if not isinstance(config, dict):
        raise ValueError("its transformer/config.json is not a JSON object")
    return config


def block_names(config) -> list[str]:
    """The transformer blocks in order, as Stable Flow numbers them (FLUX: the `num_layers`
    double-stream blocks, then the `num_single_layers` single-stream ones; SD3: its joint blocks):
    the indices `--vital-layers` and `counterfactory doctor vital-layers` use."""
    blocks = [f"transformer_blocks.{i}" for i in range(config["num_layers"])]
    return blocks + [f"single_transformer_blocks.{i}" for i in range(config.get("num_single_layers", 0))]


def config_sha256(config: dict[str, Any]) -> str:
    """The sha256 of a denoiser config as canonical JSON (sorted keys, no spaces), so the same
    config hashes the same however its file is laid out."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def loaded_identity(generator_name: str, model: str, path: str) -> dict[str, Any]:
    """The identity of the model the build loads: its name as the doctor records it, its
    transformer's blocks and its config's hash (`read_denoiser_config`)."""
    from builders.engine.provenance import model_name

    try:
        config = read_denoiser_config(model)
        blocks = block_names(config)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _refuse(
            path, f"cannot be checked: the transformer config of {model} is unreadable ({str(e)[:200]})"
        ) from e
    name, _, revision = model_name(model).partition("@")
    return {
        "generator": generator_name,
        "model": name,
        "revision": revision or None,
        "config_sha256": config_sha256(config),
        "blocks": blocks,
    }


def check_identity(path: str, recorded: dict[str, Any], loaded: dict[str, Any], model: str | None) -> None:
    """Refuse a measurement of another model (`MUST_MATCH`), warn of another revision."""
    differ = [f for f, same in MUST_MATCH.items() if _known(recorded, loaded, f) and not same(recorded[f], loaded[f])]
    if differ:
        raise _refuse(
            path,
            f"measured {describe(recorded)}, but this build loads {describe(loaded)} "
            f"({', '.join(differ)} differ{'s' if len(differ) == 1 else ''})",
            f"measure this model: `counterfactory doctor vital-layers --generator {loaded['generator']}"
            + (f" --generator-model {model}`" if model else "`"),
        )
    for f, same in SHOULD_MATCH.items():
        if _known(recorded, loaded, f) and not same(recorded[f], loaded[f]):
            log.warning(
                "--vital-layers-from %s: measured on %s %s %s, this build loads %s; vital layers are a "
                "property of the weights: measure again if they changed",
                path,
                _show(recorded["model"]),
                f,
                _show(recorded[f]),
                _show(loaded[f]),
            )


def _known(recorded: dict[str, Any], loaded: dict[str, Any], field: str) -> bool:
    return recorded.get(field) is not None and loaded.get(field) is not None


def describe(identity: dict[str, Any]) -> str:
    """`sd3 model local:sd3 (24 blocks)`: a model's identity in a message."""
    parts = [identity["generator"]]
    if identity.get("model") is not None:
        parts.append(f"model {identity['model']}")
    if identity.get("blocks") is not None:
        n = len(identity["blocks"])
        parts.append(f"({n} block{'s' if n != 1 else ''})")
    return " ".join(parts)
