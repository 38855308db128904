"""params.yaml: validation before any work, and the resolved settings each stage reads.

Every block is checked against its declaration (gcl.core.settings): the top level here, a source's in
gcl.data.sources, a benchmark kind's in gcl.data.benchmarks, a method's in its own module. The
`check@data` stage resolves the sources and benchmarks, `check@runs` the runs and the report; each
writes one small JSON file per entry under resolved/, and every other stage depends on its own file
only. So a changed caption re-runs the report alone, a changed thread count nothing, and a typo in
a run stops `dvc repro` before any training (data preparation does not depend on the runs).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, Field, field_validator

from gcl.core.layout import run_dir
from gcl.core.settings import ParamsError, Settings, validate
from gcl.core.devices import DEVICE_PATTERN
from gcl.report.settings import ReportSettings

RUN_KEYS = ("benchmark", "method", "buffer", "epochs", "width", "seeds")   # a run's own keys; the rest: method settings
RUN_OVERRIDES = ("epochs", "width")   # the benchmark's training settings a run may set for itself


def _distinct_seeds(seeds: list[int]) -> list[int]:
    if any(s < 0 for s in seeds):
        raise ValueError("seeds must be >= 0")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds must be distinct (a repeated seed would be counted twice in the std)")
    return seeds


Seeds = Annotated[list[int], Field(min_length=1), AfterValidator(_distinct_seeds)]


class TopLevel(Settings):
    """The top level of params.yaml."""

    seeds: Seeds = Field(description="seeds every run is repeated over (distinct, >= 0)")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="auto, cpu, cuda or cuda:N (a CUDA device by index)")
    workers: int | Literal["auto"] = Field(1, description="processes that train one run's seeds side by side "
                                           "(speed only); auto: on GPUs as many per GPU as its memory and the CPU "
                                           "cores allow, on the CPU one per core")
    mps: Literal["auto", "off"] = Field("auto", description="auto: when several processes share a GPU, start NVIDIA's "
                                        "Multi-Process Service if it is installed and not running (speed only)")
    threads: int = Field(1, gt=0, description="CPU threads per training process (speed only; changes no result: "
                         "the MLP's small operations run fastest on 1)")
    checkpoint_minutes: float = Field(10.0, gt=0, description="a seed saves a checkpoint at every task end and at "
                                      "least this often, and a stopped run resumes from it (no numbers change)")
    sources: dict[str, dict | None] = Field(description="raw data sources, by name")
    benchmarks: dict[str, dict] = Field(description="benchmarks, by name")
    methods: dict[str, dict | None] = Field(description="named method configurations (rows of the tables)")
    runs: dict[str, dict] = Field(description="one entry per table cell: benchmark, method, buffer, settings")
    report: dict | None = Field(None, description="what the report draws")

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError("input should be an integer greater than or equal to 1, or 'auto'")


class RunSeeds(Settings):
    """A run's own seeds, overriding the top level's (e.g. CN-DPM's 10 runs)."""

    seeds: Seeds = Field(description="seeds this run is repeated over (distinct, >= 0)")


def load_params(path: str | Path = "params.yaml") -> dict:
    """The raw params file, with its top level validated."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run from the project root, or copy a profile from profiles/")
    try:
        # libyaml's parser where PyYAML has it: 8x faster on this file, read by every stage
        params = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path} is not valid YAML: {exc}") from None
    validate(TopLevel, params, path.name)
    return params


def check_top(params: dict) -> TopLevel:
    return validate(TopLevel, params, "params.yaml")


def resolve_runtime(params: dict) -> dict:
    """How fast, not what: the settings a train stage reads straight from params.yaml (not a dependency of
    the stage, so changing them re-runs nothing): workers, threads, checkpoint_minutes, mps."""
    top = check_top(params)
    return {"workers": top.workers, "threads": top.threads, "checkpoint_minutes": top.checkpoint_minutes, "mps": top.mps}


def _check_stage(path: Path) -> str:
    """The check@ stage that writes the resolved file `path`."""
    return "check@data" if "data" in path.parts else "check@runs"


def read_resolved(path: Path) -> dict:
    """A file that a check@ stage wrote, or an error saying how to make it."""
    if not path.exists():
        raise ParamsError(f"{path} does not exist: run `dvc repro {_check_stage(path)}` (it validates params.yaml "
                          "and writes it)")
    return json.loads(path.read_text())


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value})
    return out


def read_current(path: Path, current: dict, block: str, stage: str) -> dict:
    """The file a check@ stage wrote for `stage`, refused when it no longer says what params.yaml says now
    (`current`: the stage's settings resolved from params.yaml just now; `block`: where they are, for the
    message), as after `dvc repro -s <stage>` following an edit, which skips the check@ stage that resolves
    it. So a stage never runs on settings params.yaml no longer has."""
    resolved = read_resolved(path)
    now = _flat(json.loads(json.dumps(current)))          # as the file stores it (tuples as lists)
    then = _flat({k: v for k, v in resolved.items() if k in current})
    changed = sorted(k.removeprefix("run.") for k in now.keys() | then.keys() if now.get(k, ...) != then.get(k, ...))
    if changed:
        check = _check_stage(path)
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise ParamsError(f"{block}: {shown} changed in params.yaml since {check} resolved the settings this "
                          f"stage reads ({path}): run `dvc repro {stage}` (without -s: {check} runs first), or "
                          f"`dvc repro {check}` and then this stage")
    return resolved


# ---------------------------------------------------------------------------- data

def resolve_source(params: dict, name: str) -> dict:
    from gcl.data.sources import SOURCES
    if name not in SOURCES:
        raise ParamsError(f"sources.{name}: unknown data source; known sources: {sorted(SOURCES)}")
    return validate(SOURCES[name].Settings, params["sources"][name], f"sources.{name}").model_dump()


def resolve_benchmark(params: dict, name: str) -> dict[str, dict]:
    """The benchmark's settings split into groups: data, training, runtime, display (gcl.data.benchmarks)."""
    from gcl.data.benchmarks import KINDS, MOVED_FIELDS, groups
    block, where = params["benchmarks"].get(name), f"benchmarks.{name}"
    if block is None:
        raise ParamsError(f"{where} does not exist; defined benchmarks: {sorted(params['benchmarks'])}")
    if not isinstance(block, dict):
        raise ParamsError(f"{where} must be a mapping, got {block!r}")
    kind = block.get("kind")
    if kind not in KINDS:
        raise ParamsError(f"{where}.kind: unknown benchmark kind {kind!r}; known kinds: {sorted(KINDS)}")
    for key, home in MOVED_FIELDS.items():
        if key in block:
            raise ParamsError(f"{where}.{key}: this setting has moved to {home.format(name=name)} (a benchmark's block "
                              "holds only what its data and training depend on)")
    settings = validate(KINDS[kind].Settings, block, where)
    if settings.source not in params["sources"]:
        raise ParamsError(f"{where}.source: {settings.source!r} is not listed under sources ({sorted(params['sources'])})")
    return groups(settings)


def check_data(params: dict) -> dict[str, dict]:
    """Every source and benchmark, resolved: {"sources": {name: settings}, "benchmarks": {name: groups}}."""
    check_top(params)
    return {"sources": {n: resolve_source(params, n) for n in params["sources"]},
            "benchmarks": {n: resolve_benchmark(params, n) for n in params["benchmarks"]}}


# ---------------------------------------------------------------------------- runs

def algorithm_of(params: dict, method: str) -> str:
    """The implementation behind a named method: the name itself, or its `algorithm:` (CoCa's ablations
    are configurations of one class, e.g. `coca-ckd: {algorithm: coca, pt: false, scl: false}`)."""
    from gcl.methods import METHODS
    block = params["methods"].get(method) or {}
    algorithm = block.get("algorithm", method)
    if algorithm not in METHODS:
        what = f"methods.{method}.algorithm" if "algorithm" in block else f"methods.{method}"
        raise ParamsError(f"{what}: unknown method {algorithm!r}; known methods: {sorted(METHODS)} "
                          "(`python -m gcl.describe` lists them with their settings)")
    return algorithm


def resolve_run(params: dict, key: str, top: TopLevel | None = None) -> dict:
    """One run, fully resolved: {"run": flat settings (benchmark, method, buffer, algorithm, the method's
    settings), "benchmark": the benchmark's training settings (epochs possibly overridden by the run),
    "seeds", "device"}. Method settings come from the class defaults, then `methods.<method>`, then the run.
    `top`: the validated top level, when the caller has it already."""
    from gcl.data.benchmarks import KINDS
    from gcl.methods import METHODS
    runs = params["runs"]
    if key not in runs:
        raise ParamsError(f"runs.{key} does not exist; defined runs: {sorted(runs)}")
    run, where = runs[key], f"runs.{key}"
    if not isinstance(run, dict):
        raise ParamsError(f"{where} must be a mapping, got {run!r}")
    for k in ("benchmark", "method", "buffer"):
        if k not in run:
            raise ParamsError(f"{where} lacks the key {k!r}")
    method, bench_name = run["method"], run["benchmark"]
    if bench_name not in params["benchmarks"]:
        raise ParamsError(f"{where}.benchmark: unknown benchmark {bench_name!r}; defined: {sorted(params['benchmarks'])}")
    if method not in params["methods"]:
        raise ParamsError(f"{where}.method: {method!r} has no block under methods; defined: "
                          f"{sorted(params['methods'])} (a registered method needs `methods.{method}: {{}}`)")
    algorithm = algorithm_of(params, method)
    cls = METHODS[algorithm]
    shared = {k: v for k, v in (params["methods"][method] or {}).items() if k != "algorithm"}
    try:
        settings = validate(cls.Settings, {**shared, **{k: v for k, v in run.items() if k not in RUN_KEYS}}, where)
    except ParamsError as exc:
        raise ParamsError(f"{exc}\n(method {method!r} is {algorithm!r}; `python -m gcl.describe {algorithm}` "
                          "lists its settings)") from None
    buffer = run["buffer"]
    if cls.uses_buffer:
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer <= 0:
            raise ParamsError(f"{where}.buffer must be a positive integer for method {method!r}, got {buffer!r}")
    elif buffer != "none":
        raise ParamsError(f"{where}.buffer must be 'none': method {method!r} keeps no buffer (got {buffer!r})")
    groups = resolve_benchmark(params, bench_name)
    training = groups["training"]
    for setting in RUN_OVERRIDES:
        if setting in run:
            value = run[setting]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ParamsError(f"{where}.{setting} must be a positive integer (it overrides benchmarks.{bench_name}."
                                  f"{setting}), got {value!r}")
            training[setting] = value
    if cls.needs_boundaries and not KINDS[training["kind"]].has_tasks:
        raise ParamsError(f"{where}: method {method!r} ({algorithm}) needs task boundaries, and benchmark {bench_name!r} "
                          "has none (general continual: no method is ever told where a task ends); drop this run")
    flat = {"benchmark": bench_name, "method": method, "buffer": buffer, "algorithm": algorithm,
            **settings.model_dump()}
    top = top or check_top(params)
    seeds = validate(RunSeeds, {"seeds": run["seeds"]}, where).seeds if "seeds" in run else top.seeds
    return {"key": key, "run": flat, "benchmark": training, "data": groups["data"], "seeds": seeds,
            "device": top.device}


def resolve_report(params: dict, runs: dict[str, dict] | None = None) -> dict:
    """What the report reads: the runs (flat), the benchmarks' display settings, seeds, the methods' registered
    display defaults (algorithm, and a class's optional `label` / `paper_row`), the runs' caveats (Method.caveat)
    and the report block.
    `runs`: the runs as resolve_run gives them, when the caller has resolved them already."""
    from gcl.data.benchmarks import KINDS
    from gcl.methods import METHODS
    report = validate(ReportSettings, params.get("report"), "report")
    if runs is None:
        top = check_top(params)
        runs = {key: resolve_run(params, key, top) for key in params["runs"]}
    runs = {key: spec["run"] for key, spec in runs.items()}
    benchmarks = {}
    for name in params["benchmarks"]:
        g = resolve_benchmark(params, name)
        shown = report.benchmarks.get(name)
        benchmarks[name] = {"label": shown.label if shown else "", "source": g["data"]["source"],
                            "kind": g["data"]["kind"], "has_tasks": KINDS[g["data"]["kind"]].has_tasks}
    methods = {}
    for name in params["methods"]:
        cls = METHODS[algorithm_of(params, name)]
        methods[name] = {"algorithm": cls.name, "label": getattr(cls, "label", None),
                         "paper_row": getattr(cls, "paper_row", None)}
    cells = {(r["benchmark"], f"{r['method']}/{r['buffer']}") for r in runs.values()}
    if report.visualise:
        missing = [c for c in report.visualise.cells if (report.visualise.benchmark, c) not in cells]
        if missing:
            raise ParamsError(f"report.visualise.cells: {missing} are not runs on {report.visualise.benchmark!r}; "
                              f"use 'method/buffer' of a run on that benchmark")
    # what a run measures where its settings make it something else than its method's name says (a table note)
    caveats = {key: text for key, run in runs.items() if (text := METHODS[run["algorithm"]].caveat(run))}
    return {"seeds": params["seeds"], "benchmarks": benchmarks, "methods": methods, "runs": runs,
            "caveats": caveats, "report": report.model_dump()}


def resolve_profile(params_path: Path) -> dict:
    """Another profile's params.yaml, resolved as the report reads it (report.reproductions)."""
    return resolve_report(load_params(params_path))


def check_reproductions(params: dict) -> dict:
    """Each folder of report.reproductions, verified against its own dvc.lock and resolved as the report reads it
    (gcl.report.reproductions)."""
    from gcl.report.reproductions import verify   # here: pandas, which no other stage of this module needs
    report = validate(ReportSettings, params.get("report"), "report")
    return {Path(folder).as_posix(): verify(folder, resolve_profile) for folder in report.reproductions}


def check_runs(params: dict) -> dict:
    """Every run and the report, resolved; two runs writing one folder are refused."""
    from gcl.methods import METHODS
    top = check_top(params)
    for name, block in params["methods"].items():
        algorithm = algorithm_of(params, name)
        shared = {k: v for k, v in (block or {}).items() if k != "algorithm"}
        unknown = sorted(set(shared) - set(METHODS[algorithm].Settings.model_fields))
        if unknown:
            raise ParamsError(f"methods.{name} has unknown key(s) {unknown}; {algorithm!r} accepts: "
                              f"{sorted(METHODS[algorithm].Settings.model_fields)} and 'algorithm'")
    runs, folders = {}, {}
    for key in params["runs"]:
        runs[key] = resolve_run(params, key, top)
        folder = str(run_dir(runs[key]["run"]))
        if folder in folders:
            raise ParamsError(f"runs.{key} and runs.{folders[folder]} both write {folder}: "
                              "give one of them another benchmark, method or buffer")
        folders[folder] = key
    return {"runs": runs, "report": resolve_report(params, runs)}
