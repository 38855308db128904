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


def seed_rows(count: int, device: torch.device) -> torch.Tensor:
    """(count, 1): each seed's row index, to gather per-seed positions from (S, N, ...) tensors; made once per
    (count, device), since a step indexes several batches."""
    key = (count, torch.device(device))
    rows = _SEED_ROWS.get(key)
    if rows is None:
        rows = _SEED_ROWS[key] = torch.arange(count, device=key[1]).unsqueeze(1)
    return rows


_SEED_ROWS: dict[tuple[int, torch.device], torch.Tensor] = {}


class ReservoirBuffer:
    """Named fields (examples, labels, logits, ...) of `capacity` rows each, allocated on first insertion, for one
    seed (`generator` a torch.Generator: fields (capacity, ...)) or for S stacked seeds (`generator` a list of
    their generators: fields (S, capacity, ...), batches (S, B, ...)). Which slots a batch takes and which slots a
    replay draws are each seed's own decisions, from its own generator, drawn as its lone buffer draws them; every
    seed of a stack sees batches of one size, so every seed has seen as many samples."""

    def __init__(self, capacity: int, device: torch.device | str,
                 generator: torch.Generator | list[torch.Generator]):
        if capacity <= 0:
            raise ValueError(f"buffer capacity must be positive, got {capacity}")
        self.stacked = not isinstance(generator, torch.Generator)
        self.generators = list(generator) if self.stacked else [generator]
        self.capacity = capacity
        self.device = torch.device(device)
        self.seen = 0
        self.fields: dict[str, torch.Tensor] = {}

    @property
    def generator(self) -> torch.Generator:
        """A lone seed's generator."""
        if self.stacked:
            raise TypeError("a stacked buffer has one generator per seed")
        return self.generators[0]

    def __len__(self) -> int:
        return min(self.seen, self.capacity)

    def is_empty(self) -> bool:
        return self.seen == 0

    def _allocate(self, values: dict[str, torch.Tensor]) -> None:
        """Zeroed fields shaped as `values`' samples: (capacity, ...), stacked (S, capacity, ...)."""
        lead = (len(self.generators),) if self.stacked else ()
        for name, v in values.items():
            self.fields[name] = torch.zeros((*lead, self.capacity, *v.shape[len(lead) + 1:]), dtype=v.dtype,
                                            device=self.device)

    def add(self, **values: torch.Tensor) -> None:
        """Offer a batch to the reservoir (each seed its own, stacked); every field must have the same batch size."""
        lead = 1 if self.stacked else 0
        batch = next(iter(values.values())).shape[lead]
        if not self.fields:
            self._allocate(values)
        # each seed's decisions as plain Python (a few scalars a seed), then one index tensor for all seeds
        writes = [(s, i, slot) for s, generator in enumerate(self.generators)
                  for i, slot in reservoir_pairs(self.seen, batch, self.capacity, generator)]
        self.seen += batch
        if not writes:
            return
        rows, positions, slots = to_device(torch.tensor(writes, dtype=torch.long).T.contiguous(), self.device)
        for name, v in values.items():
            field = self.fields[name]
            if self.stacked:
                field[rows, slots] = v.detach()[rows, positions].to(field.dtype)
            else:
                field.index_copy_(0, slots, v.detach().index_select(0, positions).to(field.dtype))

    def sample_indices(self, size: int) -> torch.Tensor:
        """Distinct random slots among the filled ones (all of them if fewer than `size`): (k,), stacked (S, k)."""
        picks = [torch.randperm(len(self), generator=g)[:size] for g in self.generators]
        return to_device(torch.stack(picks) if self.stacked else picks[0], self.device)

    def sample(self, size: int, *names: str) -> tuple[torch.Tensor, ...]:
        idx = self.sample_indices(size)
        if self.stacked:
            rows = seed_rows(len(self.generators), self.device)
            return tuple(self.fields[n][rows, idx] for n in names)
        return tuple(self.fields[n].index_select(0, idx) for n in names)

    def get(self, *names: str) -> tuple[torch.Tensor, ...]:
        """The filled rows of the fields (each seed's, stacked)."""
        filled = (slice(None), slice(len(self))) if self.stacked else (slice(len(self)),)
        return tuple(self.fields[n][filled] for n in names)

    def state_dict(self) -> dict:
        """Everything the buffer carries across steps (every seed's, stacked), for a checkpoint."""
        return {"capacity": self.capacity, "seen": self.seen,
                "fields": {k: v.detach().clone() for k, v in self.fields.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"a saved buffer of {state['capacity']} slots does not fit this one of {self.capacity}")
        self.seen = state["seen"]
        self.fields = {k: v.to(self.device) for k, v in state["fields"].items()}

    def seed_state(self, s: int) -> dict:
        """Seed `s`'s part of a stacked buffer, as its lone buffer's state_dict."""
        return {"capacity": self.capacity, "seen": self.seen,
                "fields": {k: v[s].detach().clone() for k, v in self.fields.items()}}
