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
