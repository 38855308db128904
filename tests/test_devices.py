"""`device:` parsing and checking, and seeds dealt out over the visible GPUs (CUDA faked: none is here)."""
import pytest
import torch

from gcl.core.devices import DeviceError, resolve_device, seed_devices


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
    from helpers import small_er_run
    spec = small_er_run([0]).model_copy(update={"device": "cuda:1"})
    with pytest.raises(DeviceError, match="no CUDA device is visible"):
        train_run(spec)
    assert not (tmp_path / "runs").exists()


class Props:
    def __init__(self, gib: float):
        self.total_memory = int(gib * 2**30)


def test_auto_workers_fill_each_gpu_by_its_memory_and_the_cores(two_gpus, monkeypatch):
    from gcl.core import devices
    memory = {0: 80.0, 1: 10.0}                      # 20 and 2 processes' worth at 4 GiB each
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props(memory[i]))
    monkeypatch.setattr(devices, "available_cores", lambda: 16)
    assert devices.PROCESS_GPU_GIB == 4.0
    # 8 cores per GPU: min(20, 8) + min(2, 8) = 10 processes, never more than the seeds
    assert devices.auto_workers(torch.device("cuda"), 50) == 10
    assert devices.auto_workers(torch.device("cuda"), 5) == 5
    assert devices.auto_workers(torch.device("cuda", 1), 50) == 2             # a named GPU alone: its memory
    monkeypatch.setattr(devices, "available_cores", lambda: 2)
    assert devices.auto_workers(torch.device("cuda"), 50) == 2                # one core per GPU
    memory[0] = 2.0                                                           # less than one process' worth
    assert devices.auto_workers(torch.device("cuda", 0), 50) == 1
    assert devices.auto_workers(torch.device("cpu"), 50) == 2                 # the CPU: one per core
    assert devices.auto_workers(torch.device("cpu"), 1) == 1


def test_stacked_groups_fill_the_cores_and_no_more(monkeypatch):
    """A stacked group keeps its threads busy: on 2 cores at 1 thread each, workers 3 gives 2 groups (3 seeds stack
    2 + 1, not 1 + 1 + 1); at 2 threads, one group; a GPU takes the workers as given."""
    from gcl.core import devices
    monkeypatch.setattr(devices, "available_cores", lambda: 2)
    cpu = torch.device("cpu")
    assert [devices.stacked_groups(w, cpu, 1) for w in (1, 2, 3, 8)] == [1, 2, 2, 2]
    assert devices.stacked_groups(3, cpu, 2) == 1 and devices.stacked_groups(3, cpu, 4) == 1
    assert devices.stacked_groups(3, torch.device("cuda"), 1) == 3


def test_workers_auto_is_a_setting_and_a_bad_value_is_named(tmp_path):
    from gcl.config import TopLevel
    from gcl.core.settings import ParamsError, validate
    base = {"seeds": [0], "sources": {}, "benchmarks": {}, "methods": {}, "runs": {}}
    assert validate(TopLevel, {**base, "workers": "auto"}, "params.yaml").workers == "auto"
    assert validate(TopLevel, base, "params.yaml").mps == "auto"
    for bad in ("many", 0, 2.5, True):
        with pytest.raises(ParamsError, match=r"params.yaml.workers = .* integer greater than or equal to 1, or 'auto'"):
            validate(TopLevel, {**base, "workers": bad}, "params.yaml")


def fake_control(tmp_path, monkeypatch, exit_code: int = 0):
    """An nvidia-cuda-mps-control on PATH that records its arguments."""
    script = tmp_path / "bin" / "nvidia-cuda-mps-control"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\necho 'no GPU here' >&2\nexit {exit_code}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    return tmp_path / "calls"


def test_mps_is_started_once_and_a_running_daemon_is_left_alone(tmp_path, monkeypatch):
    from gcl.core.devices import start_mps
    calls, said = fake_control(tmp_path, monkeypatch), []
    start_mps(said.append)
    assert calls.read_text() == "-d\n" and "started the control daemon" in said[-1]
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "control").touch()          # the daemon's pipe: one runs already
    start_mps(said.append)
    assert calls.read_text() == "-d\n" and "running already" in said[-1]


def test_mps_that_cannot_start_or_is_absent_is_said_and_training_goes_on(tmp_path, monkeypatch):
    from gcl.core.devices import start_mps
    said = []
    fake_control(tmp_path, monkeypatch, exit_code=1)
    start_mps(said.append)
    assert "could not start it (no GPU here)" in said[-1]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    start_mps(said.append)
    assert "not on PATH" in said[-1]


def test_a_cpu_seed_records_torch_s_cpu_capability_and_a_gpu_seed_does_not():
    import torch

    from gcl.core.devices import environment
    env = environment(torch.device("cpu"), bf16=False)
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu_capability"]
