"""Which reference settings a generator's model gets (builders/counterfactuals/METHOD.md §2,
"Reference settings"): decided from what the model is, not from how its id is spelled.

One decision (`ModelReference`) per build gives the default `--steps` and `--guidance-range`,
the T5 length the text encoders read and the dtype `--dtype auto` runs on CUDA. It is made from
the model's own configs (JSON only, never code): its `model_index.json` (the pipeline class and
`_name_or_path`) and its denoiser's `config.json` (FLUX's `guidance_embeds`, SD3's layer layout),
read from a local folder or the Hub cache before any weight loads, and made again from the
loaded pipeline's configs, which must agree (`check_loaded`). The names tried are the id (matched
case-insensitively, a folder by its last component, the Hub cache's `models--org--name` as
`org/name`) and the configs' `_name_or_path`; a name counts only where the configs do not
contradict it. A model of no known name gets its family's diffusers pipeline defaults, said in
one log line and recorded (`known: false`) in the manifest and the card.

The known table, each entry with its source:
- SD v1.5: the paper's 100 steps and guidance ~ U(7.5, 15) (Le et al. 2023 App. B.1.2); fp16.
- SDXL base 1.0: StableDiffusionXLPipeline's 50 / 5.0, fp16 (its card runs fp16).
- SD3-medium: its card and StableDiffusion3Pipeline: 28 / 7.0, T5 256, fp16 (its card's dtype).
- SD3.5-medium 40 / 4.5, SD3.5-large 28 / 3.5, SD3.5-large-turbo 4 / 0.0: their cards, all bf16
  (the cards load them with torch.bfloat16), T5 256 (StableDiffusion3Pipeline's default, which
  the cards keep). SD3.5-medium is the only one whose transformer has dual-attention (MMDiT-X)
  layers, so its config identifies it without its name; large and large-turbo share one
  architecture and are told apart by name only.
- FLUX.1-schnell: its card, 4 steps, no guidance; 256 T5 tokens (Black Forest Labs' CLI,
  `max_length=256` for schnell); bf16. FLUX.1-dev: FluxPipeline's 28 / 3.5 / 512 (Stable Flow
  runs 3.5), bf16. Each requires its `guidance_embeds` (schnell false, dev true).
- FLUX.1-Krea-dev is not in the table: its card's settings could not be checked from here (no
  network in the session that wrote this). It has FLUX.1-dev's architecture, guidance embedding
  included, so it gets FluxPipeline's defaults (28 / 3.5 / 512, bf16) as an unknown variant, and
  the card says so.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from builders.engine.errors import UserFacingError

log = logging.getLogger(__name__)

#: A model's JSON configs are small; anything larger is not one.
_MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Reference:
    """A model's reference settings: default `--steps` and `--guidance-range` (a fixed scale is a
    range of one value; 0: the model reads no guidance), the T5 tokens its text encoder reads
    (None: no T5), what `--dtype auto` runs it in on CUDA, and where they come from."""

    steps: int
    guidance: tuple[float, float]
    source: str
    t5_tokens: int | None = None
    dtype: str = "fp16"


@dataclass(frozen=True)
class KnownModel:
    hub_id: str
    reference: Reference
    #: Denoiser config values the model has (a value, or a test of the value): a config that says
    #: otherwise is not this model.
    config: tuple[tuple[str, Any], ...] = ()
    #: Those values identify it without its name (no other known model of the family has them).
    unique: bool = False
    #: Other names of its folder (lowercase), e.g. the id's repository name without `-diffusers`.
    aliases: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return (self.hub_id.lower().rsplit("/", 1)[-1], *self.aliases)


@dataclass(frozen=True)
class ModelReference:
    """The decision: the known model (None: an unknown variant of the family), its reference,
    and what identified it."""

    model: str | None
    reference: Reference
    identified_by: str

    @property
    def known(self) -> bool:
        return self.model is not None

    def record(self) -> dict[str, Any]:
        """What the config, the manifest and the card hold. Not `identified_by` (the log line
        says it): the config is the build's fingerprint, and the same model identified by its
        configs once they are in the Hub cache must still resume a build begun without them."""
        return {**asdict(self.reference), "model": self.model, "known": self.known}


@dataclass(frozen=True)
class ModelConfigs:
    """A model's name (id or path) and its JSON configs (None: not read)."""

    name: str
    model_index: dict | None = None
    denoiser: dict | None = None


@dataclass(frozen=True)
class Family:
    pipeline: str
    denoiser: str
    #: The default model first.
    models: tuple[KnownModel, ...]
    #: The reference of an unknown variant (diffusers' pipeline defaults), by its denoiser config.
    unknown: Callable[[dict], Reference]
    #: diffusers' defaults of the config keys the models test, where a config.json omits one.
    config_defaults: tuple[tuple[str, Any], ...] = ()


def _flux_unknown(config: dict) -> Reference:
    # FluxPipeline.__call__ defaults (diffusers 0.42): 28 steps, guidance 3.5, 512 T5 tokens. A
    # transformer without a guidance embedding reads no guidance, and such timestep-distilled
    # models read at most 256 T5 tokens (diffusers' FLUX docs, for schnell).
    if config.get("guidance_embeds", True):
        return Reference(28, (3.5, 3.5), "diffusers FluxPipeline defaults (an unknown FLUX variant)", 512, "bf16")
    return Reference(
        28, (0.0, 0.0), "diffusers FluxPipeline defaults, no guidance embedding (an unknown FLUX variant)", 256, "bf16"
    )


def _none(value: Any) -> bool:
    return not value


_SD35 = "stabilityai/stable-diffusion-3.5-"
FAMILIES: dict[str, Family] = {
    "sd15": Family(
        "StableDiffusionPipeline",
        "unet",
        (
            KnownModel(
                "stable-diffusion-v1-5/stable-diffusion-v1-5",
                Reference(100, (7.5, 15.0), "Le et al. 2023, App. B.1.2 (instruct-pix2pix's range)"),
            ),
        ),
        # The method's settings are the paper's for any SD v1 checkpoint (its guidance range is
        # the method's, not a model card's); an unknown variant is still labelled unknown.
        lambda _c: Reference(100, (7.5, 15.0), "Le et al. 2023, App. B.1.2 (an unknown Stable Diffusion variant)"),
    ),
    "sdxl": Family(
        "StableDiffusionXLPipeline",
        "unet",
        (
            KnownModel(
                "stabilityai/stable-diffusion-xl-base-1.0",
                Reference(50, (5.0, 5.0), "diffusers StableDiffusionXLPipeline defaults"),
            ),
        ),
        lambda _c: Reference(50, (5.0, 5.0), "diffusers StableDiffusionXLPipeline defaults (an unknown SDXL variant)"),
    ),
    "sd3": Family(
        "StableDiffusion3Pipeline",
        "transformer",
        (
            KnownModel(
                "stabilityai/stable-diffusion-3-medium-diffusers",
                Reference(28, (7.0, 7.0), "SD3-medium model card; diffusers StableDiffusion3Pipeline defaults", 256),
                (("num_layers", 24), ("dual_attention_layers", _none)),
                aliases=("stable-diffusion-3-medium",),
            ),
            KnownModel(
                _SD35 + "medium",
                Reference(40, (4.5, 4.5), "SD3.5-medium model card", 256, "bf16"),
                (("num_layers", 24), ("dual_attention_layers", bool)),
                unique=True,
            ),
            KnownModel(
                _SD35 + "large",
                Reference(28, (3.5, 3.5), "SD3.5-large model card", 256, "bf16"),
                (("num_layers", 38),),
            ),
            KnownModel(
                _SD35 + "large-turbo",
                Reference(4, (0.0, 0.0), "SD3.5-large-turbo model card: 4 steps, guidance 0", 256, "bf16"),
                (("num_layers", 38),),
            ),
        ),
        lambda _c: Reference(
            28, (7.0, 7.0), "diffusers StableDiffusion3Pipeline defaults (an unknown SD3 variant)", 256
        ),
        (("dual_attention_layers", ()),),
    ),
    "flux": Family(
        "FluxPipeline",
        "transformer",
        (
            KnownModel(
                "black-forest-labs/FLUX.1-schnell",
                Reference(4, (0.0, 0.0), "FLUX.1-schnell model card: 4 steps, guidance 0 (none read)", 256, "bf16"),
                (("guidance_embeds", False),),
            ),
            KnownModel(
                "black-forest-labs/FLUX.1-dev",
                Reference(28, (3.5, 3.5), "diffusers FluxPipeline defaults; Stable Flow's guidance 3.5", 512, "bf16"),
                (("guidance_embeds", True),),
            ),
        ),
        _flux_unknown,
        (("guidance_embeds", False),),
    ),
}


def default_reference(generator: str) -> Reference:
    """The reference of `generator`'s default model."""
    return FAMILIES[generator].models[0].reference


def identify(generator: str, configs: ModelConfigs) -> ModelReference:
    """The reference entry of the model `configs` describe (module docstring)."""
    family = FAMILIES[generator]
    cls = (configs.model_index or {}).get("_class_name")
    others = {f.pipeline: name for name, f in FAMILIES.items() if name != generator}
    if cls in others:
        raise UserFacingError(
            f"--generator-model {configs.name}: its model_index.json names a {cls} (--generator "
            f"{others[cls]}), not the {family.pipeline} of --generator {generator}"
        )
    config = {**dict(family.config_defaults), **(configs.denoiser or {})}
    fits = [m for m in family.models if configs.denoiser is None or _fits(m, config)]
    for name in _names(configs):
        for model in family.models:
            if name == model.hub_id.lower() or name.rsplit("/", 1)[-1] in model.names():
                if model in fits:
                    # The entry, not the name as spelled: a local path is not recorded.
                    return ModelReference(model.hub_id, model.reference, f"its name, matched to {model.hub_id}")
                log.info(
                    "%s: named like %s, but its %s config says otherwise", configs.name, model.hub_id, family.denoiser
                )
    unique = [m for m in fits if m.unique]
    if configs.denoiser is not None and len(unique) == 1:
        shown = ", ".join(f"{k}={config.get(k)!r}" for k, _ in unique[0].config)
        return ModelReference(unique[0].hub_id, unique[0].reference, f"{family.denoiser}/config.json {shown}")
    how = f"{family.denoiser}/config.json" if configs.denoiser is not None else "its id (no config read)"
    # No config read: the family's defaults as diffusers runs them (FLUX: with a guidance embedding).
    return ModelReference(None, family.unknown(config if configs.denoiser is not None else {}), how)


def _fits(model: KnownModel, config: dict) -> bool:
    return all((want(config.get(key)) if callable(want) else config.get(key) == want) for key, want in model.config)


def _names(configs: ModelConfigs) -> list[str]:
    """The names to match, lowercase: the id or path (without `@revision`), the Hub cache's
    `models--org--name` as `org/name`, and the configs' `_name_or_path`."""
    raw = [configs.name, *((c or {}).get("_name_or_path") for c in (configs.model_index, configs.denoiser))]
    names = []
    for name in raw:
        if not isinstance(name, str) or not name.strip():
            continue
        name = name.split("@")[0].rstrip("/").lower()
        cached = re.search(r"models--([^/]+?)--([^/]+)", name)
        names += [f"{cached[1]}/{cached[2]}", name] if cached else [name]
    return names


def read_configs(generator: str, model: str) -> ModelConfigs:
    """`model`'s JSON configs before its weights load: from its folder, else from the Hub cache
    (the two JSON files, which any earlier load of the id put there; no network call while the
    options are read); None where they are not there: then its id alone decides, and the
    loaded pipeline is checked against that decision (`check_loaded`)."""
    family = FAMILIES[generator]
    files = ("model_index.json", f"{family.denoiser}/config.json")
    repo, _, revision = model.partition("@")
    folder = Path(model).expanduser()
    if folder.is_dir():
        read = [_read_json(folder / f) for f in files]
    else:
        read = [_hub_json(repo, f, revision or None) for f in files]
    return ModelConfigs(model, *read)


def _read_json(path: Path) -> dict | None:
    try:
        if not path.is_file() or path.stat().st_size > _MAX_CONFIG_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _hub_json(repo: str, filename: str, revision: str | None) -> dict | None:
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, filename, revision=revision, local_files_only=True)
    except Exception as err:  # noqa: BLE001 -- any failure (not cached, not an id) means: not read
        log.debug("%s/%s not in the Hub cache (%s): the id decides", repo, filename, type(err).__name__)
        return None
    return _read_json(Path(path))


def resolve(generator: str, model: str) -> ModelReference:
    """The decision for `model` (a Hub id, optionally `@revision`, or a folder), made before it
    loads; an unknown variant is said in one log line."""
    decision = identify(generator, read_configs(generator, model))
    if not decision.known:
        log.info(
            "--generator-model %s is not a known %s model (identified by %s): it gets %s: %d steps, guidance %s",
            model,
            generator,
            decision.identified_by,
            decision.reference.source,
            decision.reference.steps,
            decision.reference.guidance[0],
        )
    return decision


def pipeline_configs(generator: str, pipe: Any) -> ModelConfigs:
    """The configs of a loaded pipeline, as `identify` reads them."""
    family = FAMILIES[generator]
    index = _as_dict(getattr(pipe, "config", None)) or {}
    denoiser = _as_dict(getattr(getattr(pipe, family.denoiser, None), "config", None))
    name = index.get("_name_or_path") or getattr(pipe, "name_or_path", "") or ""
    return ModelConfigs(str(name), index, denoiser)


def _as_dict(config: Any) -> dict | None:
    """A diffusers config (a dict) or a stand-in's attributes as a dict; None for none."""
    if config is None:
        return None
    return dict(config) if isinstance(config, dict) else dict(vars(config))


def check_loaded(generator: str, pipe: Any, recorded: dict | None) -> dict:
    """The decision of the loaded `pipe`, which must be the one the build's settings were
    resolved with (`recorded`, None: none was); raises a `UserFacingError` where the loaded model
    is another (a config the id could not be checked against before loading)."""
    loaded = identify(generator, pipeline_configs(generator, pipe)).record()
    if recorded is None:
        return loaded
    keys = ("model", *Reference.__dataclass_fields__)
    if any(_plain(loaded[k]) != _plain(recorded.get(k)) for k in keys):
        raise UserFacingError(
            f"the loaded model is {loaded['model'] or 'an unknown variant'} ({loaded['source']}), not "
            f"{recorded.get('model') or 'an unknown variant'} ({recorded.get('source')}), which this build's "
            "settings were resolved for before loading (its configs could not be read then): download the model "
            "and pass its folder to --generator-model"
        )
    return recorded


def _plain(value: Any) -> Any:
    """A value as JSON gives it back (tuples as lists), so a recorded decision compares equal."""
    return list(value) if isinstance(value, tuple) else value
