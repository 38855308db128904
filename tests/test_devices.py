"""`device:` parsing and checking, and seeds dealt out over the visible GPUs (CUDA faked: none is here)."""
import pytest
import torch

from gcl.training.devices import DeviceError, resolve_device, seed_devices


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cpu_and_auto_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu") == resolve_device("auto")
    with pytest.raises(DeviceError, match="no CUDA device is visible; use device: auto or cpu"):
        resolve_device("cuda:0")


def test_a_named_gpu(two_gpus):
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda")


def test_a_gpu_the_machine_lacks_is_refused_before_training(two_gpus):
    with pytest.raises(DeviceError, match=r"cuda:7 does not exist: 2 CUDA device\(s\) are visible \(cuda:0 to cuda:1"):
        resolve_device("cuda:7")


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CUDA", "mps"])
def test_a_malformed_device_is_refused(name):
    with pytest.raises(DeviceError, match="is not a device; use auto, cpu, cuda or cuda:N"):
        resolve_device(name)


def test_seeds_take_turns_over_every_visible_gpu(two_gpus):
    assert seed_devices(torch.device("cuda"), 5) == [torch.device("cuda", i) for i in (0, 1, 0, 1, 0)]
    assert seed_devices(torch.device("cuda", 1), 3) == [torch.device("cuda", 1)] * 3   # a named GPU: all on it
    assert seed_devices(torch.device("cpu"), 2) == [torch.device("cpu")] * 2


def test_a_bad_device_stops_the_run_before_any_training(tmp_path, monkeypatch):
    from gcl.training.run import train_run
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = {"key": "k", "run": {"benchmark": "b", "method": "er", "buffer": 10}, "benchmark": {}, "data": {},
            "seeds": [0], "device": "cuda:1"}
    with pytest.raises(DeviceError, match="no CUDA device is visible"):
        train_run(spec)
    assert not (tmp_path / "runs").exists()
