"""Command-line flags generated from typed config fields: every option is declared once, as a field.

A field declared with `option(default, help, ...)` is the flag `--FIELD-NAME` (or `flag=`). Its
type gives the argparse keywords: a bool is a switch that sets the opposite of its default
(`english_check: bool = option(True, ..., flag="--no-english-check")`), a `Literal` the choices,
`tuple[X, ...]` `nargs="+"`, `tuple[X, X]` `nargs=2`, int / Path their `type`, float a finite
number (`option_types.number`). Its metadata holds the help text (`%(default)s` is the field's
default; `%%` a percent sign), the group it is listed under and any further argparse keywords
(`type=positive_int`, `choices=...`, `metavar=...`; `builders.engine.option_types` checks
ranges). A field without `option()` is no flag; one holding another config dataclass is a
section, listed under its own group.

Every flag defaults to None, so `given_values` sees what the command line gave, and the
precedence is: dataclass defaults < a `Preset` (`--models tiny`'s sizes) < flags given (the
trainer's `--recipe` works the same way). Argparse stores each flag under its own name
(`dest_of`), so two sections may have fields of the same name. The trainer (training/options.py), every builder (builders/<dataset>/options.py)
and the run options of every build (builders/launch.py) generate their parsers here. Light (no
torch), so `--help` stays instant.

Example:
    >>> @dataclass
    ... class Stage:
    ...     steps: int = option(100, "denoising steps")
    >>> parser = argparse.ArgumentParser()
    >>> add_config_arguments(parser, Stage)
    >>> build_config(Stage, given_values(Stage, parser.parse_args(["--steps", "2"])))
    Stage(steps=2)
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from builders.engine.option_types import number

#: `{field: value}`, with `{section: {field: value}}` for a section's fields.
Values = dict[str, Any]


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    group: str | None = None,
    default_factory: Any = MISSING,
    **argparse_kwargs: Any,
) -> Any:
    """A config field that is a flag (module docstring): its default (none: a required field),
    help text, `flag` (default `--FIELD-NAME`), `group` (a help group title; default its
    section's) and argparse keywords beyond what the field's type gives."""
    return field(
        default=default,
        default_factory=default_factory,
        metadata={"help": help, "flag": flag, "group": group, "argparse": argparse_kwargs},
    )


def is_option(f: Field) -> bool:
    return "argparse" in f.metadata


def flag_of(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def dest_of(f: Field) -> str:
    """Where argparse stores the flag: named after the flag, as argparse names it, so fields of
    the same name in two sections (`fill.method`, `caption.method`) never share one."""
    return flag_of(f).lstrip("-").replace("-", "_")


def field_default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None


def _without_none(hint: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def config_fields(cls: type) -> Iterator[tuple[Field, Any]]:
    """(field, its type without `| None`) of every field of the dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        yield f, _without_none(hints[f.name])


def sections(cls: type) -> Iterator[tuple[Field, type]]:
    """The fields of `cls` that hold a config dataclass of their own (and are no flag)."""
    for f, hint in config_fields(cls):
        if not is_option(f) and dataclasses.is_dataclass(hint):
            yield f, hint


@dataclass(frozen=True)
class Preset:
    """Defaults that replace a config's own under a named profile, below any flag given: e.g.
    `Preset("--models tiny", CounterfactualsConfig, {"images": {"steps": 2}})`. Checked against
    `config` when made, so a renamed field cannot silently drop out of the preset."""

    #: How `--help` names it: "default 100 (2 with --models tiny)".
    name: str
    config: type
    values: Mapping[str, Any]

    def __post_init__(self) -> None:
        _check_names(self.config, self.values, self.name)

    def under(self, given: Values) -> Values:
        """`given` with this preset's values wherever the flags gave none."""
        return _merged(self.values, given)

    def value(self, path: tuple[str, ...]) -> Any:
        values: Any = self.values
        for name in path:
            if not isinstance(values, Mapping) or name not in values:
                return MISSING
            values = values[name]
        return values


def _check_names(cls: type, values: Mapping[str, Any], where: str) -> None:
    known = {f.name: hint for f, hint in config_fields(cls)}
    for name, value in values.items():
        if name not in known:
            raise TypeError(f"{where}: {cls.__name__} has no field {name!r}")
        if isinstance(value, Mapping) and dataclasses.is_dataclass(known[name]):
            _check_names(known[name], value, where)


def _merged(low: Mapping[str, Any], high: Values) -> Values:
    # A section the flags left alone is copied too: a caller fills in defaults of its own
    # (setdefault), which must never reach the shared preset.
    out = {name: _merged(value, {}) if isinstance(value, Mapping) else value for name, value in low.items()}
    for name, value in high.items():
        out[name] = (
            _merged(out[name], value) if isinstance(value, dict) and isinstance(out.get(name), Mapping) else value
        )
    return out


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _help(f: Field, preset: Preset | None, path: tuple[str, ...]) -> str:
    text = f.metadata["help"].replace("%(default)s", _shown(field_default(f)))
    preset_value = preset.value(path) if preset else MISSING
    if preset_value is not MISSING:
        text = (
            f"{text}{'; ' if text else ''}default {_shown(field_default(f))} "
            f"({_shown(preset_value)} with {preset.name})"
        )
    return text


def _type_keywords(f: Field, hint: Any) -> dict[str, Any]:
    if hint is bool:
        # A switch sets the opposite of the field's default: `--no-X` for a field on by default.
        return {"action": "store_const", "const": not field_default(f)}
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": typing.get_args(hint)}
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        kind = number if args[0] is float else args[0]
        if len(args) == 2 and args[1] is Ellipsis:
            return {"nargs": "+", "type": kind}
        return {"nargs": len(args), "type": kind}
    if hint is float:
        return {"type": number}  # finite: float() reads nan and inf, which pass every range check
    if hint in (int, Path):
        return {"type": hint}
    return {}


def add_field(
    container: argparse._ActionsContainer,
    f: Field,
    hint: Any,
    preset: Preset | None = None,
    path: tuple[str, ...] = (),
    required: bool = True,
) -> None:
    """The flag of one `option()` field (module docstring), defaulting to None; a field without a
    default is a required flag unless `required` is False (a field of an optional section)."""
    extra = dict(f.metadata["argparse"])
    kwargs = _type_keywords(f, hint)
    if "action" in extra:  # e.g. BooleanOptionalAction: it takes no const
        kwargs = {k: v for k, v in kwargs.items() if k not in ("action", "const")}
    if required and f.default is MISSING and f.default_factory is MISSING:
        kwargs["required"] = True
    container.add_argument(
        flag_of(f), dest=dest_of(f), default=None, help=_help(f, preset, path or (f.name,)), **{**kwargs, **extra}
    )


def argument_group(
    parser: argparse.ArgumentParser, title: str | None, descriptions: Mapping[str, str] | None = None
) -> argparse._ActionsContainer:
    """The parser's group `title` (made, with its description, when first asked for); None: the
    parser itself."""
    if title is None:
        return parser
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title, (descriptions or {}).get(title))


def add_config_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    groups: Mapping[str, str | None] | None = None,
    descriptions: Mapping[str, str] | None = None,
    preset: Preset | None = None,
    group: str | None = None,
    path: tuple[str, ...] = (),
    required: bool = True,
    adders: Mapping[type, Callable[[argparse._ActionsContainer, Field], None]] | None = None,
) -> None:
    """The flags of every `option()` field of `cls` in field order, each section's fields under
    the group `groups[section]` (a field's own `group=` wins; `descriptions` describe groups). A
    section that defaults to None is optional: its fields are never required flags. `adders` add
    the flags of a field type of their own (the trainer's `SourceRef`)."""
    groups = groups or {}
    for f, hint in config_fields(cls):
        if is_option(f):
            container = argument_group(parser, f.metadata.get("group") or group, descriptions)
            if adders and hint in adders:
                adders[hint](container, f)
            else:
                add_field(container, f, hint, preset, (*path, f.name), required)
        elif dataclasses.is_dataclass(hint) and f.name in groups:
            add_config_arguments(
                parser,
                hint,
                groups=groups,
                descriptions=descriptions,
                preset=preset,
                group=groups[f.name],
                path=(*path, f.name),
                required=required and f.default is not None,
                adders=adders,
            )


def given_values(cls: type, args: argparse.Namespace) -> Values:
    """The values the command line gave for `cls`'s fields (a section's as a dict of its own;
    lists as tuples), leaving out the flags not given."""
    values: Values = {}
    for f, hint in config_fields(cls):
        if is_option(f) and getattr(args, dest_of(f), None) is not None:
            value = getattr(args, dest_of(f))
            values[f.name] = tuple(value) if isinstance(value, list) else value
        elif not is_option(f) and dataclasses.is_dataclass(hint):
            section = given_values(hint, args)
            if section:
                values[f.name] = section
    return values


def build_config(cls: type, values: Values, **more: Any) -> Any:
    """`cls(**values, **more)`, each section made from its dict of values first (its
    `__post_init__` checks run as when the config is made in code)."""
    kwargs = dict(more)
    hints = dict((f.name, hint) for f, hint in config_fields(cls))
    for name, value in values.items():
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[name]):
            value = build_config(hints[name], value)
        kwargs[name] = value
    return cls(**kwargs)
