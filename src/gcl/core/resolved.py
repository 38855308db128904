"""The files the check@ stages write under resolved/ (gcl.core.layout), read back by the stages that depend on them:
their JSON is the wire format (each stage validates it back into its settings' types), and a stage refuses a file
that no longer says what params.yaml says (`dvc repro -s <stage>` after an edit skips the check@ stage)."""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from gcl.core.settings import ParamsError


def _check_stage(path: Path) -> str:
    """The check@ stage that writes the resolved file `path`."""
    return "check@data" if "data" in path.parts else "check@runs"


def read_resolved(path: Path) -> dict:
    """A file that a check@ stage wrote (its JSON), or an error saying how to make it."""
    if not path.exists():
        raise ParamsError(f"{path} does not exist: run `dvc repro {_check_stage(path)}` (it validates params.yaml "
                          "and writes it)")
    return json.loads(path.read_text())


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value})
    return out


def read_current(path: Path, current, block: str, stage: str):
    """The file a check@ stage wrote for `stage`, refused when it no longer says what params.yaml says now (`current`:
    the stage's settings resolved from params.yaml just now, a settings model or a mapping; `block`: where they are,
    for the message), as after `dvc repro -s <stage>` following an edit, which skips the check@ stage that resolves
    it. So a stage never runs on settings params.yaml no longer has. Read back as `current`'s model where it is one
    (model_validate), else as its JSON."""
    resolved = read_resolved(path)
    current_json = to_jsonable_python(current)       # as the file stores it (tuples as lists)
    now = _flat(current_json)
    then = _flat({k: v for k, v in resolved.items() if k in current_json})
    changed = sorted(k.removeprefix("run.") for k in now.keys() | then.keys() if now.get(k, ...) != then.get(k, ...))
    if changed:
        check = _check_stage(path)
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise ParamsError(f"{block}: {shown} changed in params.yaml since {check} resolved the settings this "
                          f"stage reads ({path}): run `dvc repro {stage}` (without -s: {check} runs first), or "
                          f"`dvc repro {check}` and then this stage")
    return type(current).model_validate(resolved) if isinstance(current, BaseModel) else resolved
