"""params.yaml: loading, validation before any work, and the resolved settings of one run.

Every check names the offending key and what it accepts, so a typo stops a stage at once
instead of silently training with a default.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from gcl.backbones import BACKBONES
from gcl.data.benchmarks import KINDS
from gcl.data.sources import SOURCES
from gcl.methods import METHODS
from gcl.settings import ParamsError, validate as validate_settings

TOP_KEYS = {"seeds", "device", "workers", "sources", "benchmarks", "methods", "runs", "report"}
BENCHMARK_KEYS = {"kind": str, "source": str, "backbone": str, "epochs": int, "threads": int,
                  "draw": str, "validation_fraction": float, "label": str,
                  "n_tasks": int, "classes_per_task": int, "augment": bool,
                  "channels_last": bool, "bf16": bool}
RUN_KEYS = {"benchmark", "method", "buffer"}


def load_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run from the project root, or copy a profile from profiles/")
    with open(path) as f:
        params = yaml.safe_load(f)
    validate(params)
    return params


def _check_type(where: str, value, kind: type, positive: bool = False) -> None:
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is bool:
        ok = isinstance(value, bool)
    if not ok:
        raise ParamsError(f"{where} must be a {kind.__name__}, got {value!r}")
    if positive and kind in (int, float) and value <= 0:
        raise ParamsError(f"{where} must be positive, got {value!r}")


def _check_keys(where: str, block, allowed) -> None:
    if not isinstance(block, dict):
        raise ParamsError(f"{where} must be a mapping, got {block!r}")
    unknown = set(block) - set(allowed)
    if unknown:
        raise ParamsError(f"{where} has unknown key(s) {sorted(unknown)}; accepted keys: {sorted(allowed)}")


def validate(params: dict) -> None:
    _check_keys("params.yaml", params, TOP_KEYS)
    for key in ("seeds", "sources", "benchmarks", "methods", "runs"):
        if key not in params:
            raise ParamsError(f"params.yaml lacks the key {key!r}")
    seeds = params["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ParamsError(f"seeds must be a non-empty list of non-negative integers, got {seeds!r}")
    workers = params.get("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ParamsError(f"workers (processes that train a cell's seeds side by side) must be a positive integer, "
                          f"got {workers!r}")
    if params.get("device", "auto") not in ("auto", "cpu", "cuda"):
        raise ParamsError(f"device must be one of ['auto', 'cpu', 'cuda'], got {params['device']!r}")
    for name in params["sources"]:
        if name not in SOURCES:
            raise ParamsError(f"sources.{name}: unknown data source; known sources: {sorted(SOURCES)}")
    for name, b in params["benchmarks"].items():
        _validate_benchmark(name, b, params["sources"])
    for name, m in params["methods"].items():
        _check_keys(f"methods.{name}", m or {}, set(METHODS[algorithm_of(params, name)].Settings.model_fields) | {"base"})
        _check_variant_inherits(params["methods"], name)
    cells = {}
    for key, run in params["runs"].items():
        resolved = resolve_run(params, key)
        cell = (resolved["benchmark"], resolved["method"], str(resolved["buffer"]))
        if cell in cells:
            raise ParamsError(f"runs.{key} and runs.{cells[cell]} both write runs/{'/'.join(cell)}: "
                              "give one of them another benchmark, method or buffer")
        cells[cell] = key


def _validate_benchmark(name: str, b: dict, sources: dict) -> None:
    where = f"benchmarks.{name}"
    _check_keys(where, b, BENCHMARK_KEYS)
    for key in ("kind", "source", "backbone", "epochs"):
        if key not in b:
            raise ParamsError(f"{where} lacks the key {key!r}")
    for key, value in b.items():
        _check_type(f"{where}.{key}", value, BENCHMARK_KEYS[key], positive=key in ("epochs", "threads", "n_tasks", "classes_per_task"))
    if b["kind"] not in KINDS:
        raise ParamsError(f"{where}.kind: unknown benchmark kind {b['kind']!r}; known kinds: {sorted(KINDS)}")
    if b["source"] not in sources:
        raise ParamsError(f"{where}.source: {b['source']!r} is not listed under sources ({sorted(sources)})")
    if b["backbone"] not in BACKBONES:
        raise ParamsError(f"{where}.backbone: unknown backbone {b['backbone']!r}; known: {sorted(BACKBONES)}")
    if not 0.0 <= b.get("validation_fraction", 0.0) < 1.0:
        raise ParamsError(f"{where}.validation_fraction must lie in [0, 1), got {b['validation_fraction']!r}")


def _check_variant_inherits(methods: dict, name: str) -> None:
    """A variant's block must hold its base's settings, written with a YAML merge key
    (`coca-ckd: {<<: *coca, base: coca, pt: false}`): a train stage depends on its own method's block
    only, so settings inherited any other way would not re-run the variant when the base changes."""
    base = (methods[name] or {}).get("base")
    if base is None or base == name or not methods.get(base):
        return
    block = methods[name]
    missing = sorted(k for k in methods[base] if k not in block)
    if missing:
        raise ParamsError(f"methods.{name}: a variant of {base!r} must carry {base!r}'s settings {missing}; "
                          f"anchor the base (`{base}: &{base} {{...}}`) and merge it into the variant "
                          f"(`{name}: {{<<: *{base}, base: {base}, ...}}`) so that DVC re-runs the variant when they change")


def resolve_run(params: dict, key: str) -> dict:
    """The run block merged over its method's shared block and the method's defaults, validated."""
    runs = params["runs"]
    if key not in runs:
        raise ParamsError(f"runs.{key} does not exist; defined runs: {sorted(runs)}")
    run, where = runs[key], f"runs.{key}"
    if not isinstance(run, dict):
        raise ParamsError(f"{where} must be a mapping, got {run!r}")
    for k in RUN_KEYS:
        if k not in run:
            raise ParamsError(f"{where} lacks the key {k!r}")
    method_name, bench_name = run["method"], run["benchmark"]
    if bench_name not in params["benchmarks"]:
        raise ParamsError(f"{where}.benchmark: unknown benchmark {bench_name!r}; defined: {sorted(params['benchmarks'])}")
    if method_name not in params["methods"]:
        raise ParamsError(f"{where}.method: {method_name!r} has no block under methods; defined: "
                          f"{sorted(params['methods'])} (a registered method needs `methods.{method_name}: {{}}`)")
    algorithm = algorithm_of(params, method_name)
    cls = METHODS[algorithm]
    shared = {k: v for k, v in (params["methods"][method_name] or {}).items() if k != "base"}
    own = {k: v for k, v in run.items() if k not in RUN_KEYS}
    settings = validate_settings(cls.Settings, {**shared, **own}, where)
    merged = {**{k: run[k] for k in RUN_KEYS}, **settings.model_dump(), "algorithm": algorithm}
    buffer = merged["buffer"]
    if cls.uses_buffer:
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer <= 0:
            raise ParamsError(f"{where}.buffer must be a positive integer for method {method_name!r}, got {buffer!r}")
    elif buffer != "none":
        raise ParamsError(f"{where}.buffer must be 'none': method {method_name!r} keeps no buffer (got {buffer!r})")
    kind = KINDS[params["benchmarks"][bench_name]["kind"]]
    if cls.needs_boundaries and not kind.has_tasks:
        raise ParamsError(f"{where}: method {method_name!r} needs task boundaries, and benchmark {bench_name!r} "
                          "has none (general continual); drop this run")
    return merged


def algorithm_of(params: dict, method_name: str) -> str:
    """The registered method behind a name under `methods`: the name itself, or the `base` of a variant
    (CoCa's ablations are variants of one class, e.g. `coca-ckd: {base: coca, pt: false, scl: false}`)."""
    block = params["methods"].get(method_name) or {}
    algorithm = block.get("base", method_name)
    if algorithm not in METHODS:
        what = f"methods.{method_name}.base" if "base" in block else f"methods.{method_name}"
        raise ParamsError(f"{what}: unknown method {algorithm!r}; known methods: {sorted(METHODS)}")
    return algorithm


# The on-disk layout that dvc.yaml's outs name: prepare@ writes a source's data.pt, benchmark@ its
# benchmark.pt, train@ a cell's folder.
def source_file(name: str) -> Path:
    return Path("data", "raw", name, "data.pt")


def benchmark_file(name: str) -> Path:
    return Path("data", "benchmarks", name, "benchmark.pt")


def cell_dir(run_cfg: dict) -> Path:
    return Path("runs") / run_cfg["benchmark"] / run_cfg["method"] / str(run_cfg["buffer"])


def fingerprint(*parts) -> str:
    """Hash of settings and of the library's source: a cached result is reused only if both match."""
    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
