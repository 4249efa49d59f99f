"""A config from plain data: a YAML file and `--set key=value` overrides into the dataclass tree,
unknown keys and wrong types refused with a message that names the key."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any, TypeVar

from raypack.config.job import JobConfig
from raypack.errors import ConfigError

__all__ = ["apply_overrides", "from_dict", "load_config", "parse_override", "typed_fields"]

T = TypeVar("T")


def load_config(
    source: str | os.PathLike[str] | dict[str, Any] | JobConfig, overrides: Sequence[str] | str | None = None
) -> JobConfig:
    """A job config from a YAML file's path, the same sections as a mapping, or a loaded JobConfig,
    with `key.path=value` overrides applied, validated; ConfigError if anything is off."""
    if isinstance(overrides, str):  # one override, not its characters
        overrides = [overrides]
    if isinstance(source, JobConfig):
        if not overrides:
            return source
        source = source.to_dict()
    if isinstance(source, dict):
        return from_dict(JobConfig, apply_overrides(source, list(overrides or [])))
    if not isinstance(source, str | os.PathLike):
        raise ConfigError(
            "a config is a YAML file's path, a mapping of its sections or a JobConfig, "
            f"not {type(source).__name__}"
        )
    path = os.fspath(source)
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read config {path}: {e}".replace("\n", " ")) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: the top level must be a mapping of sections")
    return from_dict(JobConfig, apply_overrides(data, list(overrides or [])))


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from a mapping: unknown keys and wrong types are ConfigErrors."""
    data = dict(data or {})
    _refuse_unknown(cls, data, where)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in data:
            raise ConfigError(f"missing required key {where}{f.name}")
    return cls(**typed_fields(cls, data, where))


def typed_fields(cls: type[Any], data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """Some of dataclass `cls`'s fields, each checked against its type and coerced as from_dict
    does (lists to tuples, ints to floats), without building `cls` (whose checks may need the
    fields left out): unknown keys and wrong types are ConfigErrors."""
    _refuse_unknown(cls, data, where)
    hints = typing.get_type_hints(cls)
    return {name: _coerce(value, hints[name], f"{where}{name}") for name, value in data.items()}


def _refuse_unknown(cls: type[Any], data: dict[str, Any], where: str) -> None:
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {where}{unknown[0]}; valid keys: {', '.join(fields)}")


def _shown(value: Any) -> str:
    """A value as the YAML it came from spells it (true, null), else its repr."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check `value` against a simple type hint (int, float, bool, str, tuple[int, ...], X | None,
    nested dataclass); ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, hint, key)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
        return from_dict(hint, value, f"{key}.")
    if origin is tuple or origin is list:
        return _coerce_items(value, hint, key)
    return _coerce_scalar(value, hint, key)


def _coerce_union(value: Any, hint: Any, key: str) -> Any:
    """`value` as the first of the union's types that takes it (None where the union allows it);
    else the first type's ConfigError."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, key)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")


def _coerce_items(value: Any, hint: Any, key: str) -> Any:
    """A list (or tuple) checked item by item against tuple[X, ...] or list[X], as that."""
    if typing.get_origin(hint) is tuple:
        (elem, *_rest) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {_shown(value)}")
        return tuple(_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value))
    (elem,) = typing.get_args(hint)
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list, got {_shown(value)}")
    return [_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value)]


def _coerce_scalar(value: Any, hint: Any, key: str) -> Any:
    """`value` checked against bool, int, float (an int taken) or str (a YAML date taken, as its
    ISO text)."""
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {_shown(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {_shown(value)}")
        return float(value)
    if hint is str:
        if isinstance(value, (date, datetime)):  # YAML reads 2024-07-26 as a date
            return value.isoformat()
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {_shown(value)}")
        return value
    raise TypeError(f"config field {key} has an unsupported type {hint!r}")  # a bug in raypack


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` → (["a", "b"], value), the value read as YAML (so 3, 0.5, true, [1, 2], null work)."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of nested mapping `data` with each `key.path=value` override set. A list (e.g.
    input.sources) is entered by an entry's place (input.sources.0.weight=0.3) or, for a list of
    sections, by the entry's name (input.sources.web.weight=0.3); a new list entry is not made."""
    out = _deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node: dict[str, Any] | list[Any] = out
        for depth, part in enumerate(path[:-1]):
            if isinstance(node, list):
                child = node[_entry(node, part, text, path[:depth])]
            else:
                child = node.setdefault(part, {})
            if not isinstance(child, (dict, list)):
                raise ConfigError(f"override {text!r}: {part} is not a section")
            node = child
        if isinstance(node, list):
            node[_entry(node, path[-1], text, path[:-1])] = value
        else:
            node[path[-1]] = value
    return out


def _entry(entries: list[Any], part: str, text: str, where: list[str]) -> int:
    """The place in `entries` that override `text` names by `part`: a place, or a section's name."""
    name = ".".join(where)
    if part.isdigit():
        if int(part) < len(entries):
            return int(part)
        raise ConfigError(f"override {text!r}: {name} has {len(entries)} entries, none at {part}")
    named = [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == part]
    if len(named) == 1:
        return named[0]
    names = ", ".join(repr(e["name"]) for e in entries if isinstance(e, dict) and "name" in e) or "none"
    raise ConfigError(
        f"override {text!r}: {name} has no entry named {part!r} (give its place from 0, or one of "
        f"its names: {names})"
    )


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d
