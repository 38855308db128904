"""params.yaml: validation before any work, and the resolved settings each stage reads.

Every block is checked against its declaration (gcl.core.settings): the top level and a run's own keys here, a
source's where its reader is registered (gcl.data.sources), a benchmark kind's in the module that implements it
(gcl.data.benchmark_registry), a method's in its own module; a run resolves into a typed ResolvedRun
(gcl.training.spec), whose JSON form is its file under resolved/. The `check@data` stage resolves the sources
and benchmarks, `check@runs` the runs and the report; each writes one small JSON file per entry under resolved/,
and every other stage depends on its own file only. So a changed caption re-runs the report alone, a changed
thread count nothing, and a typo in a run stops `dvc repro` before any training (data preparation does not
depend on the runs). A mistyped name, a key at any depth of a block included, is told the closest known one.
"""
from __future__ import annotations

import difflib
import functools
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, Field, field_validator
from pydantic_core import to_jsonable_python

from gcl.core.devices import DEVICE_PATTERN
from gcl.core.layout import run_dir

# what a stage reads back of the files the check@ stages write, refused when params.yaml has moved past them
from gcl.core.resolved import read_current, read_resolved  # noqa: F401  (the stages' API)
from gcl.core.settings import ParamsError, Settings, derived_model, validate
from gcl.report.settings import ReportSettings

if TYPE_CHECKING:   # imported where they are used, as the registries are
    from gcl.data.benchmark_registry import BenchmarkSettings
    from gcl.training.spec import ResolvedRun


# ---------------------------------------------------------------------------- names: what a typo is told

def did_you_mean(names: str | Iterable[str], known: Iterable[str]) -> str:
    """'; did you mean 'er'?' for the known name closest to each unknown one (difflib), '' where none is close: the
    end of an error line about a mistyped name."""
    names, known = ([names] if isinstance(names, str) else list(names)), [str(k) for k in known]
    close = {name: difflib.get_close_matches(str(name), known, n=1) for name in names}
    found = [(name, match[0]) for name, match in close.items() if match]
    if not found:
        return ""
    if len(names) == 1:
        return f"; did you mean {found[0][1]!r}?"
    return "; did you mean " + ", ".join(f"{match!r} for {name!r}" for name, match in found) + "?"


def _validate(model: type[Settings], data: Any, where: str) -> Settings:
    """`validate`, naming the closest accepted key of an unknown one at any depth of the block (a report block's
    table or method included, where validation alone would name only the top key)."""
    unknown = _first_unknown_key(model, data, where)
    if unknown:
        raise ParamsError(unknown)
    return validate(model, data, where)


def _first_unknown_key(model: type[BaseModel], data: Any, where: str) -> str | None:
    if not isinstance(data, dict):
        return None
    fields = model.model_fields
    for key, value in data.items():
        if key not in fields:
            return f"{where} has an unknown key {key!r}; accepted keys: {sorted(fields)}{did_you_mean(str(key), fields)}"
        for block, inner, at in _blocks(fields[key].annotation, value, f"{where}.{key}"):
            found = _first_unknown_key(block, inner, at)
            if found:
                return found
    return None


def _blocks(annotation, value: Any, where: str) -> Iterator[tuple[type[BaseModel], Any, str]]:
    """The settings blocks inside `value` as `annotation` declares them: a block, a list of blocks (report.tables)
    or a mapping of names to blocks (report.methods), each with its place in params.yaml."""
    for arm in _arms(annotation):
        origin, args = get_origin(arm), get_args(arm)
        if isinstance(arm, type) and issubclass(arm, BaseModel) and isinstance(value, dict):
            yield arm, value, where
        elif origin is list and isinstance(value, list):
            for i, item in enumerate(value):
                yield from _blocks(args[0], item, f"{where}.{i}")
        elif origin is dict and isinstance(value, dict):
            for name, item in value.items():
                yield from _blocks(args[1], item, f"{where}.{name}")


def _arms(annotation) -> tuple:
    """The types an annotation accepts: a union's arms, an Annotated's type, else the annotation itself."""
    if get_origin(annotation) is Annotated:
        return _arms(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for arm in get_args(annotation) for a in _arms(arm))
    return (annotation,)


# ---------------------------------------------------------------------------- the top level

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


class RunKeys(Settings):
    """A run block's own keys (`runs.<name>`); the rest of the block are its method's settings. The buffer's type
    follows the method (gcl.methods.base.buffer_field: a positive integer, or 'none' for a method without one)."""

    benchmark: str = Field(description="a key of benchmarks")
    method: str = Field(description="a key of methods")
    buffer: int | Literal["none"] = Field(description="samples kept in the method's buffer, or none")
    epochs: int | None = Field(None, gt=0, description="passes over each task for this run, overriding its "
                               "benchmark's epochs")
    width: int | None = Field(None, gt=0, description="the backbone's width for this run, overriding its "
                              "benchmark's width")
    stack: bool | Literal["auto"] | None = Field(None, description="stack this run's seeds (true, false or auto), "
                                                 "overriding its benchmark's `stack`")
    seeds: Seeds | None = Field(None, description="seeds this run is repeated over instead of the top level's "
                                "(distinct, >= 0)")


@functools.cache
def run_block(method_cls) -> type[Settings]:
    """The declaration of a run block of method `method_cls`: RunKeys, with the method's buffer, and its Settings."""
    buffer = method_cls.Run.model_fields["buffer"]
    return derived_model(f"{method_cls.__name__}RunBlock", __name__, (method_cls.Settings, RunKeys),
                         f"A run block of {method_cls.name}.", buffer=(buffer.annotation, buffer))


def load_params(path: str | Path = "params.yaml") -> dict:
    """The raw params file, with its top level validated."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run from the project root, or copy a profile from profiles/")
    try:
        # libyaml's parser where PyYAML has it: faster, and every stage reads this file (docs/performance.md)
        params = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path} is not valid YAML: {exc}") from None
    _validate(TopLevel, params, path.name)
    return params


def check_top(params: dict) -> TopLevel:
    return _validate(TopLevel, params, "params.yaml")


def resolve_runtime(params: dict) -> dict:
    """How fast, not what: the settings a train stage reads straight from params.yaml (not a dependency of
    the stage, so changing them re-runs nothing): workers, threads, checkpoint_minutes, mps."""
    top = check_top(params)
    return {"workers": top.workers, "threads": top.threads, "checkpoint_minutes": top.checkpoint_minutes, "mps": top.mps}


# ---------------------------------------------------------------------------- data

def source_kind(params: dict, name: str) -> str:
    """The reader of source `name`: its block's `kind`, by default the name itself (gcl.data.source_registry)."""
    from gcl.data.sources import SOURCES
    block = params["sources"][name]
    if block is not None and not isinstance(block, dict):
        raise ParamsError(f"sources.{name} must be a mapping, got {block!r}")
    if block and "kind" in block:
        kind = block["kind"]
        if not isinstance(kind, str) or kind not in SOURCES:
            raise ParamsError(f"sources.{name}.kind: unknown source kind {kind!r}; known kinds: {sorted(SOURCES)}"
                              f"{did_you_mean(str(kind), SOURCES)}")
        return kind
    if name not in SOURCES:
        raise ParamsError(f"sources.{name}: unknown data source; known sources: {sorted(SOURCES)} (a source of "
                          f"another name names its reader with `kind:`, e.g. kind: image-folder){did_you_mean(name, SOURCES)}")
    return name


def resolve_source(params: dict, name: str) -> Settings:
    """Source `name`'s settings, validated as its kind's (source_kind), `kind` among them."""
    from gcl.data.sources import SOURCES
    return _validate(SOURCES[source_kind(params, name)].Settings, params["sources"][name], f"sources.{name}")


def benchmark_settings(params: dict, name: str) -> BenchmarkSettings:
    """Benchmark `name`'s block, validated as its kind's settings (gcl.data.benchmark_registry)."""
    from gcl.data.benchmarks import KINDS, MOVED_FIELDS
    block, where = params["benchmarks"].get(name), f"benchmarks.{name}"
    if block is None:
        raise ParamsError(f"{where} does not exist; defined benchmarks: {sorted(params['benchmarks'])}"
                          f"{did_you_mean(name, params['benchmarks'])}")
    if not isinstance(block, dict):
        raise ParamsError(f"{where} must be a mapping, got {block!r}")
    kind = block.get("kind")
    if kind not in KINDS:
        raise ParamsError(f"{where}.kind: unknown benchmark kind {kind!r}; known kinds: {sorted(KINDS)}"
                          f"{did_you_mean(str(kind), KINDS)}")
    for key, home in MOVED_FIELDS.items():
        if key in block:
            raise ParamsError(f"{where}.{key}: this setting has moved to {home.format(name=name)} (a benchmark's block "
                              "holds only what its data and training depend on)")
    settings = _validate(KINDS[kind], block, where)
    if settings.source not in params["sources"]:
        raise ParamsError(f"{where}.source: {settings.source!r} is not listed under sources ({sorted(params['sources'])})"
                          f"{did_you_mean(settings.source, params['sources'])}")
    return settings


def resolve_benchmark(params: dict, name: str) -> dict[str, Settings]:
    """The benchmark's settings by group: {"data": what benchmark@ builds from, "training": what runs read}."""
    settings = benchmark_settings(params, name)
    return {"data": settings.data(), "training": settings.training()}


def check_data(params: dict) -> dict[str, dict]:
    """Every source and benchmark, resolved, as check@data writes them (JSON): {"sources": {name: settings},
    "benchmarks": {name: {"data": ..., "training": ...}}}."""
    check_top(params)
    return {"sources": {n: resolve_source(params, n).model_dump(mode="json") for n in params["sources"]},
            "benchmarks": {n: to_jsonable_python(resolve_benchmark(params, n)) for n in params["benchmarks"]}}


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
                          f"(`python -m gcl.describe` lists them with their settings){did_you_mean(str(algorithm), METHODS)}")
    return algorithm


def _no_method_block(params: dict, method: str) -> str:
    """Why a run's method has no block, and the fix that works: the closest defined method, or the block that a
    registered method needs."""
    from gcl.methods import METHODS
    missing = f"{method!r} has no block under methods"
    if method in METHODS:
        return f"{missing}; the registered method {method!r} needs one: add `methods.{method}: {{}}`"
    return missing + (did_you_mean(str(method), params["methods"]) or
                      f"; defined: {sorted(params['methods'])} (a new method is a block whose `algorithm:` names a "
                      "registered one: `python -m gcl.describe` lists them)")


def method_block(params: dict, method: str):
    """`methods.<method>`: (the registered class behind it, the settings it gives its runs, without `algorithm`),
    its keys checked against the class's Settings."""
    from gcl.methods import METHODS
    cls = METHODS[algorithm_of(params, method)]
    shared = {k: v for k, v in (params["methods"][method] or {}).items() if k != "algorithm"}
    unknown = sorted(set(shared) - set(cls.Settings.model_fields))
    if unknown:
        accepted = sorted(cls.Settings.model_fields)
        raise ParamsError(f"methods.{method} has unknown key(s) {unknown}; {cls.name!r} accepts: {accepted} and "
                          f"'algorithm'{did_you_mean(unknown, accepted)}")
    return cls, shared


def resolve_run(params: dict, key: str, top: TopLevel | None = None) -> ResolvedRun:
    """One run, fully resolved (gcl.training.spec.ResolvedRun): its flat settings (benchmark, method, buffer,
    algorithm, the method's settings), its benchmark's training settings (epochs and width possibly set by the
    run) and data settings, its seeds and device. Method settings come from the class defaults, then
    `methods.<method>`, then the run. `top`: the validated top level, when the caller has it already."""
    from gcl.training.spec import ResolvedRun
    runs = params["runs"]
    if key not in runs:
        raise ParamsError(f"runs.{key} does not exist" + (did_you_mean(key, runs) or f"; defined runs: {sorted(runs)}"))
    run, where = runs[key], f"runs.{key}"
    if not isinstance(run, dict):
        raise ParamsError(f"{where} must be a mapping, got {run!r}")
    for k in ("benchmark", "method"):       # what picks the declarations below
        if k not in run:
            raise ParamsError(f"{where} lacks the key {k!r}")
    method, bench_name = run["method"], run["benchmark"]
    if bench_name not in params["benchmarks"]:
        raise ParamsError(f"{where}.benchmark: unknown benchmark {bench_name!r}; defined: {sorted(params['benchmarks'])}"
                          f"{did_you_mean(str(bench_name), params['benchmarks'])}")
    if method not in params["methods"]:
        raise ParamsError(f"{where}.method: {_no_method_block(params, method)}")
    cls, shared = method_block(params, method)
    try:
        block = _validate(run_block(cls), {**shared, **run}, where)
    except ParamsError as exc:
        what = f"method {method!r}" + ("" if method == cls.name else f" configures {cls.name!r}")
        raise ParamsError(f"{exc}\n({what}: `python -m gcl.describe {cls.name}` lists its settings)") from None
    benchmark = benchmark_settings(params, bench_name)
    if cls.needs_boundaries and not benchmark.has_tasks:
        raise ParamsError(f"{where}: method {method!r} ({cls.name}) needs task boundaries, and benchmark {bench_name!r} "
                          "has none (general continual: no method is ever told where a task ends); drop this run")
    if block.head not in cls.heads:
        raise ParamsError(f"{where}.head: {cls.name} trains only the {' or '.join(cls.heads)} head, not {block.head!r}; "
                          f"drop head (or set it to {cls.heads[0]!r})")
    overrides = {"epochs": block.epochs, "width": block.width, "stack": block.stack}   # the run's own, over the benchmark's
    training = benchmark.training().model_copy(update={k: v for k, v in overrides.items() if v is not None})
    settings = cls.Run.model_validate({**block.model_dump(exclude=set(overrides) | {"seeds"}), "algorithm": cls.name})
    top = top or check_top(params)
    if training.stack is True:
        from gcl.training.stacking import unstackable
        why = unstackable(training, settings, top.device)     # the device: compile: auto compiles on a GPU
        if why is not None:
            raise ParamsError(f"{where}: stack is true, but its seeds cannot train stacked: {why}; set stack: auto "
                              "(stacked where it can be) or false")
    return ResolvedRun(key=key, run=settings, benchmark=training, data=benchmark.data(),
                       seeds=block.seeds if block.seeds is not None else top.seeds, device=top.device)


def resolve_report(params: dict, runs: dict[str, ResolvedRun] | None = None) -> dict:
    """What the report reads (JSON, resolved/runs/report.json): the runs (flat), the benchmarks' display settings,
    the seeds (the profile's, and each run's own), each named method's algorithm and the report block (which alone
    names rows and paper rows).
    `runs`: the runs as resolve_run gives them, when the caller has resolved them already."""
    from gcl.methods import METHODS
    report = _validate(ReportSettings, params.get("report"), "report")
    if runs is None:
        top = check_top(params)
        runs = {key: resolve_run(params, key, top) for key in params["runs"]}
    run_seeds = {key: list(spec.seeds) for key, spec in runs.items()}   # a run's own `seeds`, else the profile's
    runs = {key: spec.run for key, spec in runs.items()}
    benchmarks = {}
    for name in params["benchmarks"]:
        settings = benchmark_settings(params, name)
        shown = report.benchmarks.get(name)
        benchmarks[name] = {"label": shown.label if shown else "", "source": settings.source,
                            "kind": settings.kind, "has_tasks": settings.has_tasks}
    methods = {}
    for name in params["methods"]:
        cls = METHODS[algorithm_of(params, name)]
        methods[name] = {"algorithm": cls.name}
    cells = {(run.benchmark, f"{run.method}/{run.buffer}") for run in runs.values()}
    if report.visualise:
        missing = [c for c in report.visualise.cells if (report.visualise.benchmark, c) not in cells]
        if missing:
            on = sorted(c for b, c in cells if b == report.visualise.benchmark)
            raise ParamsError(f"report.visualise.cells: {missing} are not runs on {report.visualise.benchmark!r}; "
                              f"use 'method/buffer' of a run on that benchmark{did_you_mean(missing, on)}")
    return {"seeds": params["seeds"], "run_seeds": run_seeds, "benchmarks": benchmarks, "methods": methods,
            "runs": {key: run.model_dump(mode="json") for key, run in runs.items()},
            "report": report.model_dump()}


def resolve_profile(params_path: Path) -> dict:
    """Another profile's params.yaml, resolved as the report reads it (report.reproductions)."""
    return resolve_report(load_params(params_path))


def check_reproductions(params: dict) -> dict:
    """Each folder of report.reproductions, verified against its own dvc.lock and resolved as the report reads it
    (gcl.report.reproductions), its params.yaml the profile it is named after and its results/ what the report
    renders from it today (gcl.report.rerender)."""
    # here: pandas and the report, which no other stage of this module needs
    from gcl.report.reproductions import verify
    from gcl.report.rerender import check_outputs, check_profile, check_readme_blocks
    report = _validate(ReportSettings, params.get("report"), "report")
    verified = {}
    for folder in map(Path, report.reproductions):
        verified[folder.as_posix()] = record = verify(folder, resolve_profile)
        check_profile(folder)
        check_outputs(folder, record["resolved"])
        check_readme_blocks(folder, record["resolved"])
    return verified


def check_runs(params: dict) -> dict:
    """Every run and the report, resolved, as check@runs writes them (JSON): {"runs": {key: run}, "report": ...};
    two runs writing one folder are refused."""
    top = check_top(params)
    for name in params["methods"]:
        method_block(params, name)        # every method block, used by a run or not
    runs, folders = {}, {}
    for key in params["runs"]:
        runs[key] = resolve_run(params, key, top)
        folder = str(run_dir(runs[key].run))
        if folder in folders:
            raise ParamsError(f"runs.{key} and runs.{folders[folder]} both write {folder}: "
                              "give one of them another benchmark, method or buffer")
        folders[folder] = key
    return {"runs": {key: spec.to_json() for key, spec in runs.items()}, "report": resolve_report(params, runs)}
