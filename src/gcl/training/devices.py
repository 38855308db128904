"""Which device trains: `device:` of params.yaml parsed and checked, and seeds spread over the visible GPUs."""
from __future__ import annotations

import re

import torch

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"   # what params.yaml's `device:` accepts


class DeviceError(RuntimeError):
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
