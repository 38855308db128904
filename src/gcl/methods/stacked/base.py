"""What every stacked method shares: each seed's context and generator, its buffer (a StackedReservoir), the
per-seed cross-entropy, the plain SGD step of every seed, and a replayed batch per seed."""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from gcl.core.stacked import StackedReservoir, flat_seeds
from gcl.data.augment import SeedwiseTransform
from gcl.methods.base import CarriesState, Method, RunSettings, weights_changed


class StackedMethod(CarriesState):
    """S seeds of one method: `net` a stacked network, `lone` each seed's own method as setup_seed built it (its
    context, its generator above all, and any module of its own, such as CoCa's heads), `transform` the training
    transform of all seeds' batches at once (S, B, ...), each seed's augmentation its own (SeedwiseTransform;
    None: the seeds' transform draws nothing at random). Its state_dict (CarriesState: the stacked network, the
    stacked buffer, `state_attrs`) is every seed's, for the group's checkpoint."""

    name: ClassVar[str]
    uses_buffer: ClassVar[bool] = False

    def __init__(self, net: torch.nn.Module, cfg: RunSettings, lone: list[Method],
                 transform: SeedwiseTransform | None = None):
        self.net, self.cfg, self.ctx = net, cfg, lone[0].ctx     # device, classes and transforms are the seeds' alike
        self.seeds = len(lone)
        self.generators = [m.ctx.generator for m in lone]
        self.transform = transform or SeedwiseTransform(self.ctx.train_transform, [])
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.buffer = StackedReservoir(cfg.buffer, self.ctx.device, self.generators) if self.uses_buffer else None

    def observe(self, x: torch.Tensor, y: torch.Tensor, x_raw: torch.Tensor) -> torch.Tensor:
        """One update of every seed on its batch; each seed's detached loss (S,)."""
        raise NotImplementedError

    def cross_entropy(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each seed's mean cross-entropy (S,): logits (S, B, classes), labels (S, B)."""
        return F.cross_entropy(flat_seeds(logits), flat_seeds(y), reduction="none").view(y.shape).mean(1)

    def unstack(self, s: int, lone: Method) -> None:
        """Copy seed `s`'s state that lives outside the network (none, but for CoCa's heads) into its lone method."""

    def finish(self) -> None:
        """After the last stream batch (Method.finish): JOINT trains here."""

    def sgd_step(self, per_seed: torch.Tensor) -> torch.Tensor:
        """Backward the sum of the seeds' losses and take every seed's plain SGD step (Method.apply_gradients)."""
        for p in self.params:
            p.grad = None
        per_seed.sum().backward()
        self.apply_gradients()
        return per_seed.detach()

    @torch.no_grad()
    def apply_gradients(self) -> None:
        with_grad = [p for p in self.params if p.grad is not None]
        torch._foreach_add_(with_grad, [p.grad for p in with_grad], alpha=-self.cfg.lr)
        weights_changed()

    def replay_batch(self, size: int, *names: str) -> tuple[torch.Tensor, ...]:
        """Each seed's random buffer batch of the given fields (S, k, ...), the examples freshly augmented."""
        out = self.buffer.sample(size, "examples", *names)
        return (self.transform(out[0]), *out[1:])
