"""Reservoir memory: preallocated tensors on the training device, filled a whole batch at a time.

Which slots a batch takes is decided on the host with the run's own CPU generator (no device
synchronisation, identical on CPU and GPU); only the copy of the data runs on the device.
"""
from __future__ import annotations

import math

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor of sampling decisions on the training device, without stalling the host: a copy from
    pageable memory waits for the transfer, one from pinned memory is queued like a kernel."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def reservoir_slots(seen: int, batch: int, capacity: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions in the batch, buffer slots) that reservoir sampling writes, ordered by position (reservoir_pairs)."""
    pairs = reservoir_pairs(seen, batch, capacity, generator)
    return (torch.tensor([i for i, _ in pairs], dtype=torch.long),
            torch.tensor([slot for _, slot in pairs], dtype=torch.long))


def reservoir_pairs(seen: int, batch: int, capacity: int, generator: torch.Generator) -> list[tuple[int, int]]:
    """The (position in the batch, buffer slot) pairs that reservoir sampling writes, ordered by position.

    The n-th stream sample (0-based) is stored at slot n while n < capacity, else at slot
    r ~ U{0..n} when r < capacity. Where two samples of one batch pick the same slot the later
    one wins, exactly as inserting them one by one would. The decisions are a few dozen scalars: plain
    Python on the host costs a fraction of the equivalent tensor or NumPy calls.
    """
    draws = torch.rand(batch, generator=generator, dtype=torch.float64).tolist()
    winner = {}   # slot -> the latest position of the batch that takes it
    for i, u in enumerate(draws):
        n = seen + i
        slot = n if n < capacity else math.floor(u * (n + 1))
        if slot < capacity:
            winner[slot] = i
    return sorted((i, slot) for slot, i in winner.items())


class ReservoirState:
    """What a reservoir carries across steps (its slots' count, samples seen, fields), saved and restored for a
    checkpoint; shared by the lone buffer and the stacked one (gcl.core.stacked.StackedReservoir)."""

    capacity: int
    seen: int
    device: torch.device
    fields: dict[str, torch.Tensor]

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "seen": self.seen,
                "fields": {k: v.detach().clone() for k, v in self.fields.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"a saved buffer of {state['capacity']} slots does not fit this one of {self.capacity}")
        self.seen = state["seen"]
        self.fields = {k: v.to(self.device) for k, v in state["fields"].items()}


class ReservoirBuffer(ReservoirState):
    """Named fields (examples, labels, logits, ...) of `capacity` rows each, allocated on first insertion."""

    def __init__(self, capacity: int, device: torch.device | str, generator: torch.Generator):
        if capacity <= 0:
            raise ValueError(f"buffer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        self.generator = generator
        self.seen = 0
        self.fields: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return min(self.seen, self.capacity)

    def is_empty(self) -> bool:
        return self.seen == 0

    def _allocate(self, values: dict[str, torch.Tensor]) -> None:
        for name, v in values.items():
            self.fields[name] = torch.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype, device=self.device)

    def add(self, **values: torch.Tensor) -> None:
        """Offer a batch to the reservoir; every field must have the same leading size."""
        batch = next(iter(values.values())).shape[0]
        if not self.fields:
            self._allocate(values)
        positions, slots = reservoir_slots(self.seen, batch, self.capacity, self.generator)
        self.seen += batch
        if positions.numel() == 0:
            return
        positions, slots = to_device(positions, self.device), to_device(slots, self.device)
        for name, v in values.items():
            self.fields[name].index_copy_(0, slots, v.detach().index_select(0, positions).to(self.fields[name].dtype))

    def sample_indices(self, size: int) -> torch.Tensor:
        """Distinct random slots among the filled ones (all of them if fewer than `size`)."""
        return to_device(torch.randperm(len(self), generator=self.generator)[:size], self.device)

    def sample(self, size: int, *names: str) -> tuple[torch.Tensor, ...]:
        idx = self.sample_indices(size)
        return tuple(self.fields[n].index_select(0, idx) for n in names)

    def get(self, *names: str) -> tuple[torch.Tensor, ...]:
        return tuple(self.fields[n][: len(self)] for n in names)
