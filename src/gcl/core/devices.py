"""Which device trains: `device:` of params.yaml parsed and checked, and seeds spread over the visible GPUs."""
from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import shutil
import subprocess

import torch

from gcl.core.errors import UserError

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"   # what params.yaml's `device:` accepts


class DeviceError(UserError, RuntimeError):
    """params.yaml names a device this machine does not have."""


def resolve_device(name: str) -> torch.device:
    """auto (CUDA where visible, else CPU), cpu, cuda (every visible GPU, see `seed_devices`) or cuda:N."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not re.match(DEVICE_PATTERN, name):
        raise DeviceError(f"device: {name!r} is not a device; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceError(f"params.yaml asks for device: {name}, but no CUDA device is visible; "
                          "use device: auto or cpu")
    device = torch.device(name)
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceError(f"device: {name} does not exist: {count} CUDA device(s) are visible (cuda:0 to "
                          f"cuda:{count - 1}; CUDA_VISIBLE_DEVICES renumbers them from 0)")
    return device


def seed_devices(device: torch.device, seeds: int) -> list[torch.device]:
    """The device of each of `seeds` seeds: a named device (cpu, cuda:1) for all of them; plain `cuda` (or
    auto on a GPU machine) deals them out over every visible GPU in turn, cuda:0, cuda:1, ..."""
    if device.type != "cuda" or device.index is not None:
        return [device] * seeds
    count = torch.cuda.device_count()
    return [torch.device("cuda", i % count) for i in range(seeds)]


# What one training process may take on a GPU: its CUDA context, the benchmark's pool (Tiny ImageNet's 100,000
# 64x64 images are 1.2 GB), the buffer and a ResNet-18's activations at batch 64 with room to spare
# (`python -m gcl.bench grid` reports each cell's peak).
PROCESS_GPU_GIB = 4.0


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_threads(processes: int) -> int:
    """Kernel-compilation threads of each of `processes` processes that share this machine: their share of the
    cores (torch.compile would otherwise start a compiler pool of one process per core in each of them)."""
    return max(1, available_cores() // processes)


def share_compile_threads(threads: int) -> None:
    """torch.compile's compiler pool of this process (and of those it starts) takes `threads`; a value the user
    set is kept. Read when torch.compile first compiles, so it is set before that."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))


def auto_workers(device: torch.device, seeds: int) -> int:
    """`workers: auto`: processes for `seeds` seeds. On GPUs, as many per GPU as its memory holds at
    PROCESS_GPU_GIB each and the CPU cores feed (one core per process): a ResNet-18 step at batch 32 leaves
    a GPU idle most of the time in kernel launches, so several processes sharing one multiply its throughput.
    On the CPU, one per core."""
    cores = available_cores()
    if device.type != "cuda":
        return max(1, min(seeds, cores))
    gpus = list(range(torch.cuda.device_count())) if device.index is None else [device.index]
    per_gpu = [int(torch.cuda.get_device_properties(i).total_memory / 2**30 // PROCESS_GPU_GIB) for i in gpus]
    fed = max(1, cores // len(gpus))
    return max(1, min(seeds, sum(max(1, min(n, fed)) for n in per_gpu)))


def stacked_groups(workers: int, device: torch.device, threads: int) -> int:
    """How many stacked groups (one process each) a stacked run's seeds split into, from its `workers`: on the CPU
    no more than the cores hold at `threads` each, since a stacked group keeps its threads busy and a further
    group only takes seeds from the others' stacks (3 seeds on 2 cores: groups of 2 and 1, not three lone
    seeds); on a GPU, `workers` (processes that share the GPU)."""
    if device.type == "cuda":
        return max(1, workers)
    return max(1, min(workers, available_cores() // max(1, threads)))


def start_mps(say) -> None:
    """Start NVIDIA's Multi-Process Service (one GPU context shared by every process, so that their kernels
    run side by side instead of taking turns) when its control program is here and no daemon runs yet. The
    daemon stays when the run ends (other runs may be using it): `echo quit | nvidia-cuda-mps-control` stops it."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        say("MPS: nvidia-cuda-mps-control is not on PATH; the processes share the GPU by time slices")
        return
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if os.path.exists(os.path.join(pipe, "control")):
        say(f"MPS: a control daemon is running already ({pipe})")
        return
    done = subprocess.run([control, "-d"], capture_output=True, text=True)
    if done.returncode != 0:
        say(f"MPS: could not start it ({(done.stderr or done.stdout).strip() or f'exit {done.returncode}'}); "
            "the processes share the GPU by time slices")
        return
    say("MPS: started the control daemon (it stays after the run; `echo quit | nvidia-cuda-mps-control` stops it)")


def triton_available(device: torch.device) -> bool:
    """Whether torch.compile can generate kernels for this GPU: Triton is installed and the GPU is of compute
    capability 7.0 or later."""
    return importlib.util.find_spec("triton") is not None and torch.cuda.get_device_capability(device) >= (7, 0)


@functools.lru_cache(maxsize=None)
def compiler_failure(device: torch.device) -> str | None:
    """Why torch.compile cannot generate and run a kernel on `device`, in one line, or None when it can. Triton can
    be installed and still broken (a mismatched build, no C compiler for its launcher): finding it is not enough,
    and without this probe such a run failed at its first compiled step. Tried once per process and device."""
    try:
        probe = torch.compile(lambda x: x * 2 + 1, dynamic=False)
        probe(torch.ones(8, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:   # any failure of the compiler stack means: do not compile here
        reason = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {reason[0] if reason else ''}"[:300]
    return None


def device_name(device: torch.device) -> str:
    """What the numbers were computed on: the GPU's name, or the CPU's model (/proc/cpuinfo on Linux)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, bf16: bool, compiled: str | None = None) -> dict:
    """Where a seed's numbers came from. Runs are deterministic on one machine, but another CPU or torch build
    changes them within seed noise, so each seed records its own; so do bf16 autocast (on a GPU or a CPU alike:
    the loop enters it wherever the benchmark sets bf16) and a compiled backbone (`compiled`: its torch.compile
    mode, or "eager"), whose fused kernels round differently. On a CPU also torch's CPU capability (the vector
    instructions its kernels dispatch to: AVX2, AVX512, ...): one CPU model name covers machines that offer
    different instruction sets, whose float32 kernels sum in other orders (docs/design.md, "Reliability")."""
    env = {"torch": torch.__version__, "device": device_name(device), "threads": torch.get_num_threads(),
           "precision": "bf16" if bf16 else "fp32", "compiled": compiled or "eager"}
    if device.type == "cpu":
        env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return env
