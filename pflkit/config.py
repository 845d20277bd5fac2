"""Frozen dataclass configs: validation, typed overrides, plain-dict round trips.

Every config in pflkit is a frozen dataclass whose ``__post_init__`` calls
`check`-style validators, so a bad value fails with an error naming the key
before any work starts. Overrides arrive as strings (``--set key=value``) and
are parsed to the field's annotated type here.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping


# the round engines of `pflkit.fl.engines` (how a round's client updates run in this process): named here, where
# reading them imports no torch, so the command line's parser lists them from this one definition
ENGINES = ("auto", "sequential", "threads", "vectorized")
# the backends of the custom ops (`pflkit.kernels`: Triton, their PyTorch twins, or the dispatcher's pick), named
# here for the same reason
KERNEL_BACKENDS = ("auto", "triton", "reference")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def require(cond: bool, key: str, value: Any, why: str) -> None:
    """Raise `ConfigError` naming ``key`` and ``value`` unless ``cond`` holds."""
    if not cond:
        raise ConfigError(f"{key}={value!r}: {why}")


def positive(key: str, value: float) -> None:
    require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, key, value, "must be > 0")


def non_negative(key: str, value: float) -> None:
    require(isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, key, value, "must be >= 0")


def one_of(key: str, value: Any, choices) -> None:
    require(value in choices, key, value, f"must be one of {sorted(choices)}")


def fraction(key: str, value: float) -> None:
    require(isinstance(value, (int, float)) and 0 < value <= 1, key, value, "must be in (0, 1]")


def reject_unknown_options(what: str, given, accepted) -> None:
    """TypeError naming the first of ``given`` that ``what`` (e.g. ``"model 'lenet'"``) does not take."""
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TypeError(f"{what} has no option {unknown[0]!r}; it takes {', '.join(sorted(accepted)) or 'no options'}")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse_scalar(text: str, typ, key: str):
    """Parse ``text`` as ``typ`` (bool, int, float, str, tuple[...] or Optional)."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        errors = []
        for a in args:
            try:
                return _parse_scalar(text, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}={text!r}: not a valid {typ}")
    if origin is tuple:
        inner = typing.get_args(typ)
        parts = [p.strip() for p in text.strip("()[] ").split(",") if p.strip()]
        item = inner[0] if inner else str
        return tuple(_parse_scalar(p, item, key) for p in parts)
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}={text!r}: expected a boolean (true/false)")
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{key}={text!r}: expected an integer") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{key}={text!r}: expected a number") from None
    if typ is str:
        return text
    if typ is typing.Any:
        return text
    raise ConfigError(f"{key}: cannot parse a value of type {typ}")


def coerce(value: Any, typ, key: str) -> Any:
    """Check / convert a value from TOML or a string override to the field type."""
    if isinstance(value, str) and typ is not str:
        return _parse_scalar(value, typ, key)
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        for a in args:
            try:
                return coerce(value, a, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={value!r}: expected {typ}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            value = (value,)
        inner = typing.get_args(typ)
        item = inner[0] if inner else typing.Any
        return tuple(coerce(v, item, key) for v in value)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected a boolean")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}={value!r}: expected an integer")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r}: expected a number")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r}: expected a string")
        return value
    return value


def from_dict(cls, values: Mapping[str, Any], prefix: str = ""):
    """Build the frozen dataclass ``cls`` from a mapping, type-checking every key."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"{prefix}{unknown[0]}: unknown setting for {cls.__name__}; known: {', '.join(sorted(names))}"
        )
    kwargs = {k: coerce(v, hints[k], prefix + k) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:  # validators may already name the full key (data.num_clients)
        msg = str(e)
        raise ConfigError(msg if msg.startswith(prefix) else f"{prefix}{msg}") from None


OMIT_DEFAULT = {"omit_default": True}  # field metadata: left out of `to_dict` at its default value


def to_dict(cfg) -> dict[str, Any]:
    """A JSON-friendly dict of a (possibly nested) dataclass config. A field declared with ``metadata=
    OMIT_DEFAULT`` is left out at its default value, so results made before it existed keep their fingerprints."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.metadata.get("omit_default") and v == f.default:
            continue
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def parse_override(text: str) -> tuple[str, str]:
    """Split ``key=value`` (the CLI's ``--set``) into its parts."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value")
    key, value = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {text!r}: empty key")
    return key, value.strip()
