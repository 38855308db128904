"""HAL, Hindsight Anchor Learning (Chaudhry et al. 2021): ER on a ring buffer plus anchors kept stable.

Memory (`memory`): "ring" (default, the paper): one FIFO of buffer // n_classes slots per class (the
benchmark's classes, known in advance, as in the ring buffer of Chaudhry et al.): a class's newest
images replace its oldest, so an old class keeps buffer // n_classes images from the first task on.
"reservoir" (the reference framework, mammoth, the paper profile's value): mammoth asks for a 'ring'
buffer, but its insertion is reservoir sampling, and the seen-counter reset it makes at a task's end
compares the task index with the number of tasks, so it never fires: in effect one reservoir over the
whole stream, which keeps buffer / classes seen images of each old class (on seq-cifar10 at buffer 200:
50, 33, 25 after tasks 2, 3, 4, where the ring keeps 20).

Step (the paper's Algorithm 1, and the reference's update): with B the stream batch joined to a
replayed buffer batch and theta the current weights,
    theta~ = theta - lr * grad CE(B; theta)                          (a temporary ER step)
    theta <- theta - lr * grad [ CE(B; theta) + lambda * mean((f_theta~(E) - f_theta(E))^2) ]
with E the anchors (one per class seen) and f_theta~(E) held constant. The reference reaches
exactly this update by accumulating both gradients at the old weights. Then the running feature
mean phi <- beta * phi + (1 - beta) * mean features of the stream batch (new weights); phi starts at
zero at each task's beginning (the reference rebuilds it after each task).

At each task's end (the reference's schedule):
  1. fine-tune a copy of the network on the buffer: `finetune_steps` SGD steps (lr) on batches of
     the stream batch size (the reference: one step) -> theta_M;
  2. for each class c of the task, an anchor e_c (network-input space, initialised uniform in
     [0, 1) as the reference does) is optimised by `anchor_steps` SGD steps (lr) on
        -CE(f_theta_M(e), c) + CE(f_theta(e), c) + gamma * sum((features_theta(e) - phi)^2)
     i.e. the point whose loss fine-tuning would raise most, near the task's mean feature.
The reference optimises one anchor at a time (batch of one, BatchNorm in train mode); here a task's
anchors are optimised together as one batch with summed losses: identical for networks whose samples
do not interact (the MLP), a departure only through BatchNorm's batch statistics (ResNet-18), where
the anchors' batch is also how they are fed during training.

Costs: the replay draw reads one count on the host per step only while the buffer holds fewer than
replay_batch images; after that sampling stays on the device.
"""
from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from gcl.core.buffer import ReservoirBuffer, to_device
from gcl.methods.base import Method, ReplaySettings, TaskData, register, weights_changed


class RingBuffer:
    """Per-class FIFO memory: `per_class` slots for each of `n_classes` classes, filled on the device.

    Slot (c, k) holds class c's k-th newest-but-cyclic image: the n-th image of class c goes to slot
    n mod per_class. A batch is written in one index_copy: each sample's rank among its class in the
    batch gives its slot; samples that a later one of the same batch would overwrite go to a spare
    row that is never read.
    """

    def __init__(self, n_classes: int, per_class: int, device: torch.device, generator: torch.Generator):
        if per_class <= 0:
            raise ValueError(f"a ring buffer needs at least one slot per class, got {per_class}")
        self.n_classes, self.per_class = n_classes, per_class
        self.device, self.generator = torch.device(device), generator
        self.counts = torch.zeros(n_classes, dtype=torch.long, device=self.device)   # images seen per class
        self.examples: torch.Tensor | None = None
        self.labels = torch.arange(n_classes, device=self.device).repeat_interleave(per_class)
        self.seen = 0
        self._enough = 0        # the host knows that at least this many slots are filled

    @property
    def slots(self) -> int:
        return self.n_classes * self.per_class

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.examples is None:
            self.examples = torch.zeros((self.slots + 1, *x.shape[1:]), dtype=x.dtype, device=self.device)
        onehot = F.one_hot(y, self.n_classes)
        rank = (onehot.cumsum(0) - onehot).gather(1, y[:, None]).squeeze(1)    # earlier samples of its class
        in_batch = onehot.sum(0)[y]
        slot = y * self.per_class + (self.counts[y] + rank) % self.per_class
        survives = rank >= in_batch - self.per_class
        slot = torch.where(survives, slot, torch.full_like(slot, self.slots))   # overwritten: the spare row
        self.examples.index_copy_(0, slot, x)
        self.counts += onehot.sum(0)
        self.seen += len(y)

    def filled(self) -> torch.Tensor:
        """Mask over the slots that hold an image."""
        return (torch.arange(self.per_class, device=self.device)[None, :] < self.counts[:, None]).reshape(-1)

    def is_empty(self) -> bool:
        return self.seen == 0

    def sample(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to `size` distinct filled slots, uniformly at random: (uint8 images, labels)."""
        if self._enough < size:      # early on: how many are filled decides the batch size (host read)
            self._enough = int(self.filled().sum())
        n = min(size, self._enough)
        keys = to_device(torch.rand(self.slots, generator=self.generator), self.device)
        keys = keys.masked_fill(~self.filled(), 2.0)          # empty slots sort last
        idx = keys.topk(n, largest=False).indices
        return self.examples.index_select(0, idx), self.labels.index_select(0, idx)

    def state_dict(self) -> dict:
        return {"counts": self.counts.clone(), "examples": None if self.examples is None else self.examples.clone(),
                "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.counts = state["counts"].to(self.device)
        self.examples = None if state["examples"] is None else state["examples"].to(self.device)
        self.seen, self._enough = state["seen"], 0


def anchor_objective(net_t, net_m, anchors: torch.Tensor, classes: torch.Tensor, phi: torch.Tensor,
                     gamma: float) -> torch.Tensor:
    """HAL's anchor loss summed over anchors: -CE under theta_M + CE under theta_t + gamma ||phi(e) - phi||^2."""
    forget = F.cross_entropy(net_m(anchors), classes, reduction="sum")
    keep = F.cross_entropy(net_t(anchors), classes, reduction="sum")
    near = (net_t.features(anchors) - phi[None, :]).pow(2).sum()
    return -forget + keep + gamma * near


def optimise_anchors(net_t, net_m, init: torch.Tensor, classes: torch.Tensor, phi: torch.Tensor,
                     gamma: float, lr: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` plain SGD steps on the anchors from `init` (the networks are not updated).
    Returns the anchors and the objective before each step and after the last (steps + 1 values)."""
    e = init.clone().requires_grad_(True)
    curve = []
    for _ in range(steps):
        loss = anchor_objective(net_t, net_m, e, classes, phi, gamma)
        (grad,) = torch.autograd.grad(loss, e)
        curve.append(loss.detach())
        with torch.no_grad():
            e -= lr * grad
    with torch.no_grad():
        curve.append(anchor_objective(net_t, net_m, e, classes, phi, gamma))
    return e.detach(), torch.stack(curve)


class ReservoirMemory:
    """The reference framework's HAL memory: the shared reservoir (images and labels) over the whole stream,
    with the ring buffer's interface."""

    def __init__(self, capacity: int, device: torch.device, generator: torch.Generator):
        self.buffer = ReservoirBuffer(capacity, device, generator)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.buffer.add(examples=x, labels=y)

    def sample(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.buffer.sample(size, "examples", "labels")

    def is_empty(self) -> bool:
        return self.buffer.is_empty()

    def state_dict(self) -> dict:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)


class HALSettings(ReplaySettings):
    hal_lambda: float = Field(ge=0, description="weight lambda of the anchor-stability loss")
    beta: float = Field(ge=0, le=1, description="decay of the running mean of the stream's features (phi)")
    gamma: float = Field(ge=0, description="weight of the anchors' distance to the feature mean phi")
    anchor_steps: int = Field(100, gt=0, description="SGD steps that optimise each task's anchors (reference: 100)")
    finetune_steps: int = Field(1, ge=0, description="SGD steps of fine-tuning on the buffer before the anchors (reference: 1)")
    memory: Literal["ring", "reservoir"] = Field(
        "ring", description="per-class ring buffer (the paper) or one reservoir over the stream (the reference framework)")


@register
class HAL(Method):
    trains_alone = "it works at task boundaries, which stacked seeds do not see"
    name = "hal"
    summary = ("HAL: ER on a per-class ring buffer (or a reservoir), plus anchors learned at task ends whose outputs "
               "are kept stable")
    needs_boundaries = True
    uses_buffer = True
    reservoir = False       # a memory of its own (below), not the shared reservoir
    Settings = HALSettings
    state_attrs = ("memory", "anchors", "anchor_classes", "phi")

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        if cfg.memory == "reservoir":
            self.store = ReservoirMemory(cfg.buffer, ctx.device, ctx.generator)
        else:
            per_class = cfg.buffer // ctx.n_classes
            if per_class == 0:
                raise ValueError(f"hal: a buffer of {cfg.buffer} gives no ring slot to each of {ctx.n_classes} classes")
            self.store = RingBuffer(ctx.n_classes, per_class, ctx.device, ctx.generator)
        self.anchors: torch.Tensor | None = None          # (classes seen, *input shape), network-input space
        self.anchor_classes: torch.Tensor | None = None
        self.phi: torch.Tensor | None = None
        self.last_anchor_curve: torch.Tensor | None = None

    # the memory travels in state_dict as a plain dict
    @property
    def memory(self) -> dict:
        return self.store.state_dict()

    @memory.setter
    def memory(self, state: dict) -> None:
        self.store.load_state_dict(state)

    def begin_task(self, task: TaskData) -> None:
        self.phi = None

    def observe(self, x, y, x_raw):
        inputs, labels = x, y
        if not self.store.is_empty():
            buf_x, buf_y = self.store.sample(self.cfg.replay_batch)
            inputs, labels = torch.cat([x, self.ctx.train_transform(buf_x)]), torch.cat([y, buf_y])
        loss = F.cross_entropy(self.net(inputs), labels)
        grads = torch.autograd.grad(loss, self.params)
        if self.anchors is not None:
            lr = self.cfg.lr
            with torch.no_grad():      # f at theta~ = theta - lr * grad CE, held constant
                saved = [p.detach().clone() for p in self.params]
                torch._foreach_add_(self.params, grads, alpha=-lr)
                weights_changed()
                tilde = self.net(self.anchors)
                torch._foreach_copy_(self.params, saved)
                weights_changed()
            stability = self.cfg.hal_lambda * (tilde - self.net(self.anchors)).pow(2).mean()
            grads = torch._foreach_add(grads, torch.autograd.grad(stability, self.params))
        for p, g in zip(self.params, grads):
            p.grad = g
        self.apply_gradients()
        with torch.no_grad():
            mean_feat = self.net.features(x).mean(0)
            self.phi = mean_feat * (1 - self.cfg.beta) if self.phi is None else \
                self.cfg.beta * self.phi + (1 - self.cfg.beta) * mean_feat
        self.store.add(x_raw, y)
        return loss.detach()

    def end_task(self, task: TaskData) -> None:
        theta_t = copy.deepcopy(self.net)
        theta_t.requires_grad_(False)
        theta_m = copy.deepcopy(self.net)
        ft_params = [p for p in theta_m.parameters() if p.requires_grad]
        for _ in range(self.cfg.finetune_steps):
            buf_x, buf_y = self.store.sample(self.cfg.batch)
            ft_loss = F.cross_entropy(theta_m(self.ctx.train_transform(buf_x)), buf_y)
            with torch.no_grad():
                torch._foreach_add_(ft_params, torch.autograd.grad(ft_loss, ft_params), alpha=-self.cfg.lr)
                weights_changed()
        theta_m.requires_grad_(False)
        lo, hi = task.classes
        classes = torch.arange(lo, hi, device=task.y.device)
        shape = tuple(self.ctx.train_transform(task.x_raw[:1]).shape[1:])
        init = torch.rand((hi - lo, *shape), generator=self.ctx.generator).to(task.y.device)
        phi = self.phi if self.phi is not None else torch.zeros(self.net.feat_dim, device=task.y.device)
        anchors, self.last_anchor_curve = optimise_anchors(theta_t, theta_m, init, classes, phi,
                                                           self.cfg.gamma, self.cfg.lr, self.cfg.anchor_steps)
        self.anchors = anchors if self.anchors is None else torch.cat([self.anchors, anchors])
        self.anchor_classes = classes if self.anchor_classes is None else torch.cat([self.anchor_classes, classes])

    def extra_metrics(self) -> dict:
        return {"anchors": 0 if self.anchors is None else len(self.anchors)}
