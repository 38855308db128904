"""python -m gcl.bench same-state (gcl.bench.same_state): two saved seed states compare equal only when every tensor and
value is, timings aside; `save` with another checkout's library runs in a process of its own."""
from pathlib import Path

import pytest
import torch

from gcl.bench import same_state

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.slow
def test_a_seed_saved_with_a_checkouts_library_is_the_seed_saved_here(tmp_path, monkeypatch, capfd):
    """--code runs the save in a process of its own under that checkout's src/ (here this one's, so the two states
    must be equal); a folder that is no checkout is refused."""
    from gcl.config import resolve_benchmark
    from gcl.data.benchmarks import build_benchmark
    from image_fixtures import labelled_source, write_er_params
    params = write_er_params(tmp_path)
    build_benchmark(resolve_benchmark(params, "seq")["data"], labelled_source(per_class=8),
                    tmp_path / "data" / "benchmarks" / "seq")
    monkeypatch.chdir(tmp_path)
    assert same_state.main(["save", "seq-er-50", "0", "here.pt"]) == 0
    assert same_state.main(["save", "seq-er-50", "0", "there.pt", "--code", str(ROOT)]) == 0
    assert f"library: {ROOT / 'src' / 'gcl'}" in capfd.readouterr().out
    assert same_state.main(["compare", "here.pt", "there.pt"]) == 0
    with pytest.raises(SystemExit, match="no src/gcl there"):
        same_state.main(["save", "seq-er-50", "0", "x.pt", "--code", str(tmp_path)])
    torch.set_num_threads(1)


def test_the_state_is_saved_at_the_first_task_end_and_never_on_the_clock(tmp_path):
    """Two processes reach a clock-timed checkpoint at different steps, so only a task end is a step both stop at:
    with the clock already past `every_seconds`, no save is due until a task ends, and then the state is written
    to the path given and the seed stops (_Saved)."""
    from gcl.training.checkpoint import Checkpoint
    checkpoint = same_state.first_task_end(Checkpoint)(tmp_path / "seed.pt", "-", 0.0)
    assert not checkpoint.due(False)
    assert checkpoint.due(True)
    assert checkpoint.load(print) is None
    with pytest.raises(same_state._Saved):
        checkpoint.save({"loop": {"step": 1000}})
    assert torch.load(tmp_path / "seed.pt")["loop"]["step"] == 1000
