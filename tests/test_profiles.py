"""profiles/mnist-360.yaml is the paper profile's MNIST-360 part (every profile is validated in test_config.py)."""
from pathlib import Path

from gcl.config import load_params

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def test_the_mnist_360_profile_is_the_paper_profiles_mnist_360_part():
    part, paper = load_params(PROFILES / "mnist-360.yaml"), load_params(PROFILES / "paper.yaml")
    assert part["benchmarks"] == {"mnist-360": paper["benchmarks"]["mnist-360"]}
    assert part["sources"] == {"mnist": paper["sources"]["mnist"]}
    assert part["runs"] == {k: r for k, r in paper["runs"].items() if r["benchmark"] == "mnist-360"}
    used = {r["method"] for r in part["runs"].values()}
    assert set(part["methods"]) == used
    assert {m: part["methods"][m] for m in used} == {m: paper["methods"][m] for m in used}
    shown = {m: paper["report"]["methods"][m] for m in used if m in paper["report"]["methods"]}
    assert {m: part["report"]["methods"][m] for m in shown} == shown
