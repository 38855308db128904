"""Checkpoints inside a training job (one seed, or a group of stacked seeds): everything a stopped job needs to go on
as if it had never stopped.

A checkpoint holds the method's state (network, buffer, cross-task attributes), the training loop's
position and bookkeeping (step, each seed's evaluation rows, loss sums) and every random state the job draws from
(each seed's own generators, Python, NumPy, torch CPU and CUDA). It is written atomically at task ends and at
least every `checkpoint_minutes`, and carries the fingerprint of the seed's settings, data and code: a
checkpoint with another fingerprint is refused (named, and deleted) and the seed starts afresh.
"""
from __future__ import annotations

import pickle
import random
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gcl.core.atomic import save_tensors


def global_rng_states(device: torch.device) -> dict:
    """The process's random states (Python, NumPy, torch's CPU and CUDA generators), as tensors and plain values
    (loadable with weights_only); a group's own generators are saved beside them (gcl.training.loop)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_global_rng_states(states: dict, device: torch.device) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if device.type == "cuda":
        if states["cuda"] is None:
            raise ValueError("this checkpoint was written on the CPU and cannot resume on CUDA")
        torch.cuda.set_rng_state(states["cuda"], device)


@dataclass
class Checkpoint:
    """One training job's checkpoint file (`owner`: "seed", or "group" for stacked seeds). Picklable, so that a
    worker process can be handed it."""

    path: Path
    fingerprint: str
    every_seconds: float
    owner: str = "seed"
    # when the last one was written (or the seed began); the monotonic clock is the machine's, so a worker
    # process handed this object compares against it correctly
    last: float = field(default_factory=time.monotonic, repr=False, compare=False)

    def due(self, task_ended: bool) -> bool:
        return task_ended or time.monotonic() - self.last >= self.every_seconds

    def save(self, state: dict) -> None:
        save_tensors(self.path, {"fingerprint": self.fingerprint, **state})
        self.last = time.monotonic()

    def load(self, say) -> dict | None:
        """The saved state, or None when there is none; a checkpoint of other settings, data or code (or one
        that cannot be read) is refused with a line through `say` and deleted."""
        return load_fingerprinted(self.path, self.fingerprint, say, "checkpoint",
                                  f"the {self.owner} starts from the beginning", self.owner)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def load_fingerprinted(path: Path, fingerprint: str, say, what: str, then: str, owner: str = "seed") -> dict | None:
    """A file of tensors saved with `fingerprint` (`what`: a checkpoint, a seed's features file), or None when
    there is none. One that cannot be read, or that carries another fingerprint, is refused with a line through
    `say` (ending with `then`, what happens instead) and deleted: never half-trust it."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        # PyTorch's own message is not quoted: it suggests loading with weights_only=False, which would run
        # whatever code the file holds
        reason = f"it cannot be read ({type(exc).__name__}: damaged, or not a {what} this project wrote)"
    else:
        if state.get("fingerprint") == fingerprint:
            return state
        reason = (f"it was written for other settings, data or code (fingerprint {state.get('fingerprint')}, "
                  f"this {owner}'s is {fingerprint})")
    say(f"{what} {path} refused: {reason}; it is deleted and {then}")
    path.unlink(missing_ok=True)
    return None
