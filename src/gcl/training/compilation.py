"""Whether a run's backbones are compiled (torch.compile, CUDA graphs on a GPU): decided once per run.

gcl.training.run decides it before any seed trains: every seed's fingerprint records the mode (the setting `auto`
may compile on one machine and not on another) and every seed applies it (run_seed's `compiled`, which sets the
backbone's `compile_mode`). Scripts that train a seed themselves call compile_mode the same way.
"""
from __future__ import annotations

import functools
import sys

import torch

from gcl.core.devices import compiler_failure, triton_available
from gcl.core.errors import UserError
from gcl.methods.base import Method


def compile_mode(setting: bool | str, device: torch.device, method_cls: type[Method]) -> str | None:
    """The torch.compile mode of a run's backbones (None: eager) from the benchmark's `compile` setting. `auto`
    compiles on a GPU only: there CUDA graphs ("reduce-overhead") remove the kernel-launch cost that dominates a
    small-batch step, while on a CPU a compiled step would move the numbers by rounding for little gain. Methods
    that are not `capturable` stay eager."""
    forced = setting is True          # else False, or the setting's default, auto
    if not may_compile(setting, device.type, method_cls):
        return None
    if device.type != "cuda":
        return "default"
    if not triton_available(device):
        if not forced:
            return None
        raise UserError("compile: true needs Triton on this GPU (pip install triton; compute capability 7.0 or "
                        "later): install it, or set the benchmark's compile to auto (eager here) or false")
    if (failure := compiler_failure(device)) is None:
        return "reduce-overhead"
    if not forced:
        return _say_once(f"compile: auto trains eager: torch.compile fails on {device} ({failure})")
    raise UserError(f"compile: true, but torch.compile fails on {device} ({failure}): repair Triton (pip install "
                    "--force-reinstall triton matching this torch), or set the benchmark's compile to auto or false")


def may_compile(setting: bool | str, device: str, method_cls: type[Method]) -> bool:
    """Whether `compile: <setting>` may compile a run of `method_cls` on `device` (params.yaml's `device`, auto, cpu,
    cuda or cuda:N, or a resolved device's type): `true` wherever the method is capturable, `auto` where the device
    may be a GPU. What check@runs knows before the machine does (a run stacked and compiled is refused there)."""
    if not method_cls.capturable or setting is False:
        return False
    return setting is True or device.split(":")[0] in ("auto", "cuda")


@functools.lru_cache(maxsize=None)
def _say_once(line: str) -> None:
    """Print `line` on stderr, once per process; returns None."""
    print(line, file=sys.stderr, flush=True)
