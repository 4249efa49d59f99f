"""Configuration: frozen dataclasses, validated when built, so a bad value fails before any work.

Every section is `@dataclass(frozen=True, kw_only=True, slots=True)` with its checks in __post_init__;
`from_dict` builds one from plain data (a YAML mapping, `--set key=value` overrides), rejecting unknown
keys and wrong types with a message that names the key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from raypack.packing import ALGORITHMS, OVERFLOW_POLICIES
from raypack.packing.bucket import DEFAULT_PADDING_THRESHOLD

__all__ = ["ConfigError", "PackConfig", "apply_overrides", "from_dict", "parse_override"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration mistake the user can fix; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PackConfig:
    seq_len: int = 2048
    """Tokens per pack (the largest bucket for `bucket`)."""
    algorithm: str = "bfd"
    """One of raypack.packing.ALGORITHMS."""
    overflow: str = "split"
    """Documents longer than seq_len: split (chunks + remainder), truncate, or drop."""
    seed: int = 0
    """Seed for the order of packs in the output."""
    shuffle: bool = True
    """Permute pack ids with `seed` (packers that sort by length would otherwise emit a length-sorted
    dataset, which biases training); false keeps plan order."""
    max_depth: int | None = None
    """Most items per pack for bfd/lpfhp/spfhp (None: unlimited) and nnlshp (None: 3)."""
    bucket_lengths: tuple[int, ...] | None = None
    """Bucket lengths for `bucket`, largest = seq_len (None: seq_len/8, /4, /2, seq_len)."""
    padding_threshold: float = DEFAULT_PADDING_THRESHOLD
    """`bucket`: largest padding share a smaller bucket may have before a larger one is tried."""
    nnls_bin_width: int | None = None
    """`nnlshp`: tokens per length class (None: seq_len / 256, rounded up)."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"pack.seq_len must be >= 1, got {self.seq_len}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"pack.algorithm {self.algorithm!r} is unknown; choose from {', '.join(ALGORITHMS)}"
            )
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(
                f"pack.overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.overflow!r}"
            )
        if self.max_depth is not None and self.max_depth < 1:
            raise ConfigError(f"pack.max_depth must be >= 1 or null, got {self.max_depth}")
        if self.algorithm == "nnlshp" and self.max_depth is not None and self.max_depth > 3:
            raise ConfigError(f"pack.max_depth must be <= 3 for nnlshp, got {self.max_depth}")
        if self.bucket_lengths is not None:
            if not self.bucket_lengths or min(self.bucket_lengths) < 1:
                raise ConfigError(f"pack.bucket_lengths must be positive, got {list(self.bucket_lengths)}")
            if max(self.bucket_lengths) != self.seq_len:
                raise ConfigError(
                    f"pack.bucket_lengths: the largest bucket must equal seq_len={self.seq_len}, "
                    f"got {list(self.bucket_lengths)}"
                )
        if not 0.0 <= self.padding_threshold < 1.0:
            raise ConfigError(f"pack.padding_threshold must be in [0, 1), got {self.padding_threshold}")
        if self.nnls_bin_width is not None and not 1 <= self.nnls_bin_width <= self.seq_len:
            raise ConfigError(f"pack.nnls_bin_width must be in 1..seq_len, got {self.nnls_bin_width}")

    def algorithm_options(self) -> dict[str, Any]:
        """Keyword options for the chosen packer, from the fields that apply to it."""
        accepted = ALGORITHMS[self.algorithm].options
        candidates: dict[str, Any] = {
            "max_depth": self.max_depth,
            "bucket_lengths": self.bucket_lengths,
            "padding_threshold": self.padding_threshold,
            "bin_width": self.nnls_bin_width,
        }
        return {k: v for k, v in candidates.items() if k in accepted and v is not None}


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from a mapping: unknown keys and wrong types are ConfigErrors."""
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {where}{unknown[0]}; valid keys: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(value, hints[name], f"{where}{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field without a default
        raise ConfigError(f"{where.rstrip('.') or cls.__name__}: {e}") from None


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check `value` against a simple type hint (int, float, bool, str, tuple[int, ...], X | None,
    nested dataclass); ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
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
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
        return from_dict(hint, value, f"{key}.")
    if origin is tuple:
        (elem, *_rest) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is list:
        (elem,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
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
    """Return a copy of nested mapping `data` with each `key.path=value` override set."""
    out = _deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deepcopy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy(v) if isinstance(v, dict) else v for k, v in d.items()}
