"""Declared settings: every block of params.yaml is a pydantic model, declared once.

A declaration gives each setting its type, default, bounds and a one-line help (`description`).
The same declaration validates params.yaml (unknown key, wrong type, non-finite or out-of-range
value: an error that names the key, the value and what is accepted), fills in defaults for the
resolved configuration stored with the results, and generates the settings reference
(`python -m gcl.describe`).
"""
from __future__ import annotations

import re
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from gcl.core.errors import UserError


class ParamsError(UserError, ValueError):
    """params.yaml is malformed; the message names the key, the value and what is accepted."""


class Settings(BaseModel):
    """Strict: no unknown keys, no coercion (a string is not a float, a bool is not an int), finite floats."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def accepted(model: type[BaseModel], field: str) -> str:
    """What a field accepts, in words: its type, bounds and help."""
    info = model.model_fields.get(field)
    if info is None:
        return ""
    if get_origin(info.annotation) is Literal:
        kind = "one of " + ", ".join(repr(a) for a in get_args(info.annotation))
    else:
        kind = getattr(info.annotation, "__name__", None) or str(info.annotation)
        kind = re.sub(r"\b[a-z_]+\.", "", kind).replace(" | ", " or ")
    bounds = []
    for m in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(m, attr, None) is not None:
                bounds.append(f"{sym} {getattr(m, attr)}")
    text = kind + (f" {' and '.join(bounds)}" if bounds else "")
    return f"{text}: {info.description}" if info.description else text


def validate(model: type[Settings], data: Any, where: str) -> Settings:
    """`model` from `data`, or a ParamsError naming `where.<key>`, the value and what is accepted."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{where} must be a mapping, got {data!r}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ParamsError("\n".join(_describe_error(model, where, e, data) for e in exc.errors())) from None


def _describe_error(model: type[BaseModel], where: str, error: dict, data: dict) -> str:
    loc = [str(p) for p in error["loc"]]
    key = loc[0] if loc else ""
    path = ".".join([where, *loc])
    if error["type"] == "extra_forbidden":
        return f"{where} has an unknown key {key!r}; accepted keys: {sorted(model.model_fields)}"
    if error["type"] == "missing":
        return f"{where} lacks the key {key!r} ({accepted(model, key)})"
    value = error.get("input")
    return f"{path} = {value!r} is not accepted: {error['msg'].lower()} ({accepted(model, key)})"


def defaults_table(model: type[BaseModel]) -> list[dict]:
    """One row per setting: name, type and bounds, default (or 'required'), help."""
    rows = []
    for name, info in model.model_fields.items():
        default = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
        rows.append({"setting": name, "accepts": accepted(model, name).split(":")[0], "default": default,
                     "help": info.description or ""})
    return rows


def defaults(model: type[BaseModel]) -> dict:
    """The declared defaults of the optional settings."""
    return {name: info.get_default(call_default_factory=True)
            for name, info in model.model_fields.items() if not info.is_required()}
