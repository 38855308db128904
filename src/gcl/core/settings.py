"""Declared settings: every block of params.yaml is a pydantic model, declared once.

A declaration gives each setting its type, default, bounds and a one-line help (`description`).
The same declaration validates params.yaml (unknown key, wrong type, non-finite or out-of-range
value: an error that names the key, the value and what is accepted), fills in defaults for the
resolved configuration stored with the results, and generates the settings reference
(`python -m gcl.describe`).
"""
from __future__ import annotations

import re
import sys
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from gcl.core.errors import UserError


class ParamsError(UserError, ValueError):
    """params.yaml is malformed; the message names the key, the value and what is accepted."""


class Settings(BaseModel):
    """Strict: no unknown keys, no coercion (a string is not a float, a bool is not an int), finite floats."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def derived_model(name: str, module: str, base: type[BaseModel] | tuple[type[BaseModel], ...], doc: str,
                  **fields) -> type[BaseModel]:
    """A model made from declarations (pydantic's create_model): `base` with `fields` ({name: (type, Field)}),
    defined as `module.name`, so that its instances pickle (a worker process gets them) as a written class's do."""
    model = create_model(name, __base__=base, __module__=module, __doc__=doc, **fields)
    setattr(sys.modules[module], name, model)
    return model


def _is_union(annotation) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)   # Optional[X], Union[X, Y] and X | Y


def type_in_words(annotation, arm: bool = False) -> str:
    """A field's type as a reader of params.yaml would say it: `int > 0`'s int, "one of 'a', 'b'", and a union's
    arms joined by "or" (a one-value Literal as the value itself: "int or 'auto'")."""
    if get_origin(annotation) is Annotated:
        return type_in_words(get_args(annotation)[0], arm)
    if get_origin(annotation) is Literal:
        values = get_args(annotation)
        return repr(values[0]) if len(values) == 1 else "one of " + ", ".join(repr(v) for v in values)
    if _is_union(annotation):
        return " or ".join(type_in_words(a, arm=True) for a in get_args(annotation))
    if annotation is type(None):
        return "None"
    kind = getattr(annotation, "__name__", None) or str(annotation)
    return re.sub(r"\b[a-z_]+\.", "", kind).replace(" | ", " or ")


def accepted(model: type[BaseModel], field: str) -> str:
    """What a field accepts, in words: its type, bounds and help."""
    info = model.model_fields.get(field)
    if info is None:
        return ""
    bounds = []
    for m in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(m, attr, None) is not None:
                bounds.append(f"{sym} {getattr(m, attr)}")
    arms = get_args(info.annotation) if _is_union(info.annotation) else ()
    if bounds and type(None) in arms:     # the bounds bind the value, not None: "int > 0 or None"
        others = [a for a in arms if a is not type(None)]
        text = f"{' or '.join(type_in_words(a, arm=True) for a in others)} {' and '.join(bounds)} or None"
    else:
        text = type_in_words(info.annotation) + (f" {' and '.join(bounds)}" if bounds else "")
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
        lines = (_describe_error(model, where, e, data) for e in exc.errors())
        raise ParamsError("\n".join(dict.fromkeys(lines))) from None   # a union's arms give one line, once


def _describe_error(model: type[BaseModel], where: str, error: dict, data: dict) -> str:
    loc = [str(p) for p in error["loc"]]
    key = loc[0] if loc else ""
    path = ".".join([where, *loc])
    if error["type"] == "extra_forbidden":
        return f"{where} has an unknown key {key!r}; accepted keys: {sorted(model.model_fields)}"
    if error["type"] == "missing":
        return f"{where} lacks the key {key!r} ({accepted(model, key)})"
    value = error.get("input")
    if len(loc) > 1 and _plain_union(model, key):
        # pydantic reports each arm of the union (`compile.bool`, ...): the key accepts any of them
        return f"{where}.{key} = {value!r} is not accepted ({accepted(model, key)})"
    return f"{path} = {value!r} is not accepted: {error['msg'].lower()} ({accepted(model, key)})"


def _plain_union(model: type[BaseModel], key: str) -> bool:
    """Whether the field is a union of plain values (no nested settings, whose own keys an error names)."""
    info = model.model_fields.get(key)
    if info is None or not _is_union(info.annotation):
        return False
    return not any(isinstance(a, type) and issubclass(a, BaseModel) for a in get_args(info.annotation))


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
