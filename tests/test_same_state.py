"""tools/same_state.py: two saved seed states compare equal only when every tensor and value is, timings aside."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import same_state  # noqa: E402


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"method": {"net": {"w": torch.randn(3, 4, generator=g), "bn.running_mean": torch.zeros(4)},
                       "buffer": {"examples": torch.arange(12, dtype=torch.uint8).reshape(3, 4), "seen": 7}},
            "loop": {"step": 1000, "rows": [[1, 90.5]], "train_seconds": 12.5},
            "rng": {"torch": torch.get_rng_state()}}


def saved(tmp_path: Path, name: str, s: dict) -> Path:
    torch.save(s, tmp_path / name)
    return tmp_path / name


def test_equal_states_compare_equal_and_timings_are_skipped(tmp_path, capsys):
    a, b = state(), state()
    b["loop"]["train_seconds"] = 99.0
    assert same_state.compare(saved(tmp_path, "a.pt", a), saved(tmp_path, "b.pt", b)) == 0
    assert "4 tensors (5,084 numbers)" in capsys.readouterr().out


def test_one_weight_one_ulp_apart_is_a_difference(tmp_path, capsys):
    a, b = state(), state()
    w = b["method"]["net"]["w"]
    w[1, 2] = torch.nextafter(w[1, 2], torch.tensor(float("inf")))
    assert same_state.compare(saved(tmp_path, "a.pt", a), saved(tmp_path, "b.pt", b)) == 1
    assert "/method/net/w" in capsys.readouterr().out


def test_values_dtypes_and_keys_are_compared():
    a = state()
    b = state()
    b["method"]["buffer"]["seen"] = 8
    b["method"]["buffer"]["examples"] = b["method"]["buffer"]["examples"].to(torch.int64)
    b["loop"]["extra"] = 1
    found = list(same_state.differences(a, b))
    assert "/method/buffer/seen: 7 != 8" in found
    assert "/method/buffer/examples" in found
    assert "/loop/extra (in one state only)" in found
    assert len(found) == 3
