"""The library's imports form no circle (every import counted, those inside functions too)."""
import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


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


def test_no_import_circle():
    graph = import_graph()
    assert len(graph) > 40 and graph["gcl.data.sources"] >= {"gcl.data.image_sources", "gcl.data.source_registry"}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None
    assert order.index("gcl.data.source_registry") < order.index("gcl.data.image_sources")
