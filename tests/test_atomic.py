"""Write-then-rename: no half-written file is ever visible, and saved tensors are byte-reproducible."""
import os
import stat

import pytest
import torch

from gcl.core.atomic import atomic_dir, atomic_path, save_tensors, write_json


def test_same_tensors_give_the_same_bytes(tmp_path):
    """DVC hashes outputs: a rebuilt benchmark or source must not look changed when its content is not."""
    obj = {"x": torch.arange(12, dtype=torch.uint8).view(3, 4), "classes": ["a", "b"]}
    save_tensors(tmp_path / "one" / "data.pt", obj)
    save_tensors(tmp_path / "two" / "data.pt", obj)
    assert (tmp_path / "one" / "data.pt").read_bytes() == (tmp_path / "two" / "data.pt").read_bytes()
    assert torch.equal(torch.load(tmp_path / "one" / "data.pt")["x"], obj["x"])


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_written_files_and_folders_honour_the_umask(tmp_path, mask):
    """A group sharing a workspace reads the outputs as it would any file the user made (mkstemp alone: 0600)."""
    old = os.umask(mask)
    try:
        write_json(tmp_path / "m.json", {"a": 1})
        with atomic_dir(tmp_path / "run") as folder:
            (folder / "x").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o777 & ~mask
