"""The library's imports form no circle, and its folders are layers: each imports only the layers below it
(every import counted, those inside functions too)."""
import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# each folder (or top-level module) of gcl, and the parts of the library it may import besides itself
LAYERS = {
    "core": set(),
    "data": {"core"},
    "report": {"core"},
    "methods": {"core", "data"},
    "training": {"core", "data", "methods"},
    "config": {"core", "data", "methods", "training", "report"},     # training: the typed run it resolves
    "describe": {"core", "data", "methods", "training", "report", "config"},
    "rerender": {"core", "report", "config"},      # the command that renders a committed reproduction again
    "warm": {"core"},
    "cluster": {"core"},     # submits train@ cells as jobs and gathers them through dvc: it imports no pipeline code
    # the commands a user runs beside the pipeline (no stage imports them)
    "tune": {"core", "data", "methods", "training", "config"},       # validation grids, through the train code
    "dryrun": {"core", "data", "report", "config"},     # a profile cut for the CPU, run through `dvc repro`
    "snapshot": {"core", "report"},                     # a workspace's finished runs into a reproduction folder
    "bench": {"core", "data", "methods", "training", "config"},      # timings of the train code on random images
}


def import_graph() -> dict[str, set[str]]:
    """Module -> the gcl modules it imports (a package's __init__ under the package's name)."""
    files = {}
    for f in (SRC / "gcl").rglob("*.py"):
        parts = f.relative_to(SRC).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for module, f in files.items():
        graph[module] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import name`: the submodule pkg.name where it is one, else pkg itself
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
    return graph


def script_imports(script: Path, graph: dict[str, set[str]]) -> set[str]:
    """The gcl modules a script imports, inside functions too, and all that they import in turn."""
    todo = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            todo += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            todo += [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in graph else node.module
                     for a in node.names]
    seen = set()
    while todo:
        name = todo.pop()
        while name and name not in graph:
            name = name.rpartition(".")[0]
        if name and name not in seen:
            seen.add(name)
            todo += graph[name]
    return seen


def module_file(module: str) -> str:
    path = SRC / Path(*module.split("."))
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(SRC.parent).as_posix()


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None      # gcl itself: no layer


def test_no_import_circle():
    graph = import_graph()
    assert len(graph) > 40 and graph["gcl.data.sources"] >= {"gcl.data.cifar_sources", "gcl.data.source_registry"}
    assert graph["gcl.data.benchmarks"] >= {"gcl.data.mnist360", "gcl.data.sequential"}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None
    assert order.index("gcl.data.source_registry") < order.index("gcl.data.image_sources")
    assert order.index("gcl.data.benchmark_registry") < order.index("gcl.data.sequential")


def test_every_import_points_down_the_layers():
    graph = import_graph()
    assert {layer(m) for m in graph} - {None} == set(LAYERS)      # every folder is placed
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if layer(m) and layer(d) and layer(d) != layer(m) and layer(d) not in LAYERS[layer(m)])
    assert not upward, upward
    # the check itself would see one: a training module importing the report
    assert "report" not in LAYERS["training"] and "training" not in LAYERS["methods"]


def test_no_module_is_long_without_saying_why():
    """~300 lines at most, unless its docstring says why it is longer."""
    for f in (SRC / "gcl").rglob("*.py"):
        lines = f.read_text().count("\n")
        if lines > 320:
            doc = ast.get_docstring(ast.parse(f.read_text())) or ""
            assert "lines" in doc, f"{f.relative_to(SRC)}: {lines} lines and no reason at its top"


def test_the_check_and_report_stages_depend_on_all_the_code_they_run():
    """A stage whose code changes must run again: every module the check and report scripts import (at any depth)
    is a dependency of the stage in dvc.yaml, or part of the train code (TRAIN_CODE), whose digest reaches the
    report through resolved/runs. (prepare@ and benchmark@ list the code that makes their data: the settings
    they read reach them through config's lazy imports of every layer, which change no pixel.)"""
    import yaml

    from gcl.core.layout import TRAIN_CODE
    graph = import_graph()
    stages = yaml.safe_load((SRC.parent / "dvc.yaml").read_text())["stages"]
    for name in ("check", "report"):
        stage = stages[name].get("do", stages[name])
        script = SRC.parent / stage["cmd"].split()[3]
        covers = list(stage["deps"]) + (list(TRAIN_CODE) if "resolved/runs" in stage["deps"] else [])
        files = {module_file(m) for m in script_imports(script, graph)}
        assert len(files) > 20, files
        missing = sorted(f for f in files if not any(f == c or f.startswith(c.rstrip("/") + "/") for c in covers))
        assert not missing, f"{name}: dvc.yaml's deps miss {missing}"
