"""The library's imports form no circle, and its folders are layers: each imports only the layers below it
(every import counted, those inside functions too). A module longer than the rest is named, with the reason, in
docs/design.md."""
import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LONG_MODULE = 320       # lines a module may have before docs/design.md must say why it is longer
DESIGN_LIST = "docs/design.md's '## Long modules'"

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


def long_modules_listed(design: str) -> dict[str, str]:
    """Path -> reason of each bullet of docs/design.md's "## Long modules" section (`- `src/gcl/x.py`: why`)."""
    section = re.search(r"^## Long modules\n(.*?)(?=^## |\Z)", design, re.M | re.S)
    return {m[1]: m[2].strip() for m in re.finditer(r"^- `([^`]+)`:[ \t]*(.*)$", section[1], re.M)} if section else {}


def long_module_problems(root: Path, design: str, limit: int = LONG_MODULE) -> list[str]:
    """What breaks the rule on long modules under root/src/gcl: a module over `limit` lines that design.md's list
    does not name with a reason, a listed module that is not there or not that long, a docstring that says its
    module's length. Each problem names the module and the fix."""
    listed = long_modules_listed(design)
    problems = []
    for f in sorted((root / "src" / "gcl").rglob("*.py")):
        name, text = f.relative_to(root).as_posix(), f.read_text()
        lines = text.count("\n")
        if re.search(r"\bAbout \d+ lines\b", ast.get_docstring(ast.parse(text)) or "", re.I):
            problems.append(f"{name}: its docstring says how long it is. Fix: keep the docstring to the module's "
                            f"contract; a long module's reason goes in {DESIGN_LIST}")
        if lines > limit and not listed.get(name):
            problems.append(f"{name}: {lines} lines (over {limit}) and no reason in {DESIGN_LIST}. Fix: add a bullet "
                            f"`- `{name}`: <why it is long>` there, or split the module")
        elif name in listed and lines <= limit:
            problems.append(f"{name}: {lines} lines, within {limit}. Fix: remove it from {DESIGN_LIST}")
    problems += [f"{name}: no such module. Fix: remove it from {DESIGN_LIST}, or correct its path"
                 for name in listed if not (root / name).is_file()]
    return problems


def test_no_module_is_long_without_saying_why():
    """~300 lines at most, unless docs/design.md's list of long modules says why it is longer; a docstring states
    its module's contract, not its length."""
    design = (SRC.parent / "docs" / "design.md").read_text()
    assert len(long_modules_listed(design)) >= 5, f"{DESIGN_LIST} not found, or nearly empty"
    problems = long_module_problems(SRC.parent, design)
    assert not problems, "\n".join(problems)


def test_the_long_module_check_finds_what_it_should(tmp_path):
    """The check itself: a long module missing from the list, one listed without a reason, a listed module that is
    short or gone, and a docstring giving its module's length are each named; a listed long module passes."""
    gcl = tmp_path / "src" / "gcl"
    gcl.mkdir(parents=True)
    (gcl / "long.py").write_text('"""A long module."""\n' + "x = 1\n" * 30)
    (gcl / "short.py").write_text('"""A short one.\n\nAbout 3 lines: it is short."""\nx = 1\n')
    listed = "# Notes\n\n## Long modules\n\n- `src/gcl/long.py`: it is long for a reason.\n\n## Next\n"

    assert long_module_problems(tmp_path, listed.replace("long.py`", "other.py`"), limit=20) == [
        "src/gcl/long.py: 31 lines (over 20) and no reason in docs/design.md's '## Long modules'. Fix: add a bullet "
        "`- `src/gcl/long.py`: <why it is long>` there, or split the module",
        "src/gcl/short.py: its docstring says how long it is. Fix: keep the docstring to the module's contract; a "
        "long module's reason goes in docs/design.md's '## Long modules'",
        "src/gcl/other.py: no such module. Fix: remove it from docs/design.md's '## Long modules', or correct its "
        "path"]
    (gcl / "short.py").write_text('"""A short one."""\nx = 1\n')
    assert long_module_problems(tmp_path, listed, limit=20) == []
    no_reason = long_module_problems(tmp_path, listed.replace("it is long for a reason.", ""), limit=20)
    assert len(no_reason) == 1 and no_reason[0].startswith("src/gcl/long.py: 31 lines (over 20) and no reason")
    assert long_module_problems(tmp_path, listed, limit=40) == [
        "src/gcl/long.py: 31 lines, within 40. Fix: remove it from docs/design.md's '## Long modules'"]
    # a bullet under another heading does not count
    assert long_module_problems(tmp_path, listed.replace("## Long modules", "## Other"), limit=20)


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
