"""docs/extending.md names only files and names that exist; every doc's links resolve."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_path_and_name_in_the_extending_guide_exists():
    text = (ROOT / "docs" / "extending.md").read_text()
    paths = {p for p in re.findall(r"`([\w./-]+\.(?:py|md|yaml|csv))`", text) if "<" not in p}
    assert len(paths) >= 15
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing
    code = "".join(p.read_text() for p in (ROOT / "src" / "gcl").rglob("*.py"))
    for name in ("register_kind", "data_setting", "training_setting", "BenchmarkSettings", "register_source",
                 "locate_archive", "extra_metrics", "state_attrs", "needs_boundaries", "uses_buffer", "reservoir",
                 "offline", "paper_row", "summarise", "summary_frame", "TableSpec", "ReplaySettings",
                 "ResolvedRun", "TRAIN_CODE"):
        assert name in code, name


def test_every_link_of_every_doc_resolves():
    """Relative links of README.md, docs/*.md and the report's documents point at files that exist."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+://", path) and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def readme_layout() -> dict[str, str]:
    """docs/layout.md's Layout block (the README's page of what lives where): each src/gcl folder (and top-level
    module) line, with its continuation lines."""
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    entries, current = {}, None
    for line in block.splitlines():
        found = re.match(r"^      (\w+)(/|\.py)\s", line)
        if found:
            current = found.group(1)
            entries[current] = line
        elif current and line.startswith(" " * 21) and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def test_the_readme_names_every_module_of_the_library():
    """The Layout block lists every module of src/gcl by name (folders whose files are one per method, methods/,
    are named as folders); a new module docs/layout.md leaves out fails here."""
    layout = readme_layout()
    src = ROOT / "src" / "gcl"
    folders = sorted(p.name for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.stem for p in src.glob("*.py") if p.stem != "__init__")
    block = " ".join(layout.values())
    missing = [name for name in folders if name not in layout] + [m for m in modules if f"{m}.py" not in block]
    assert not missing, f"docs/layout.md's Layout names no {missing}"
    for folder in folders:
        if folder == "methods":        # one file per method, registered by name: the folder says so
            continue
        unnamed = [p.stem for p in sorted((src / folder).glob("*.py")) if p.stem not in ("__init__", "__main__")
                   and not re.search(rf"\b{p.stem}\b", layout[folder])]
        assert not unnamed, f"docs/layout.md's Layout, {folder}/: {unnamed} not named"


def test_the_readme_counts_the_default_profiles_stages():
    """The stage count the README gives with its timing is dvc.yaml's stages expanded over params.yaml."""
    import yaml
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    expands = {"check": len(stages["check"]["foreach"]), "prepare": len(params["sources"]),
               "benchmark": len(params["benchmarks"]), "train": len(params["runs"])}
    count = sum(expands.get(name, 1) for name in stages)
    for doc in ("README.md", "docs/performance.md"):
        said = re.findall(r"\b(\d+) stages\b", (ROOT / doc).read_text())
        assert said and all(int(n) == count for n in said), (doc, said, count)


def test_the_guides_example_method_is_the_one_that_runs():
    """docs/extending.md shows ER's class as src/gcl/methods/er.py holds it, character for character."""
    text = (ROOT / "docs" / "extending.md").read_text()
    shown = text.split("```python\n", 1)[1].split("\n```", 1)[0]
    source = (ROOT / "src" / "gcl" / "methods" / "er.py").read_text()
    assert shown.startswith("@register\nclass ER(Method):") and shown in source, \
        "docs/extending.md's example differs from src/gcl/methods/er.py: copy the class again"
