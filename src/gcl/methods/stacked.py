"""The steps of the methods whose seeds train stacked (gcl.core.stacked): one `observe` for S seeds at once.

A stacked method is the step of its lone method (gcl.methods.<name>) with a seed dimension in front of every
batch: x (S, B, ...), y (S, B); it returns each seed's loss (S,). Its loss is the sum of the seeds' losses, each
the lone method's loss of that seed, so each seed's weights move exactly as they would alone; its buffer is a
StackedReservoir whose draws are each seed's own, in the lone method's order. On the MLP: SGD, JOINT, ER, ER-ACE,
A-GEM, DER, DER++, CoCa and CLS-ER (docs/performance.md says which methods stack and which cannot).
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from gcl.core.stacked import StackedMLP, StackedReservoir, flat_seeds, stack_sequential, unstack_sequential
from gcl.data.transforms import to_unit_float
from gcl.methods.agem import project
from gcl.methods.base import Method, RunSettings, weights_changed
from gcl.methods.clser import memory_decay, memory_draws, memory_targets
from gcl.methods.coca.method import collaborative_target, supcon_loss
from gcl.methods.coca.pretext import apply_pretext, pretext_labels


class StackedMethod:
    """S seeds of one method: `net` a stacked network, `lone` each seed's own method as setup_seed built it (its
    context, its generator above all, and any module of its own, such as CoCa's heads)."""

    name: ClassVar[str]
    uses_buffer: ClassVar[bool] = False

    def __init__(self, net: torch.nn.Module, cfg: RunSettings, lone: list[Method]):
        self.net, self.cfg, self.ctx = net, cfg, lone[0].ctx     # device, classes and transforms are the seeds' alike
        self.seeds = len(lone)
        self.generators = [m.ctx.generator for m in lone]
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.buffer = StackedReservoir(cfg.buffer, self.ctx.device, self.generators) if self.uses_buffer else None

    def observe(self, x: torch.Tensor, y: torch.Tensor, x_raw: torch.Tensor) -> torch.Tensor:
        """One update of every seed on its batch; each seed's detached loss (S,)."""
        raise NotImplementedError

    def cross_entropy(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each seed's mean cross-entropy (S,): logits (S, B, classes), labels (S, B)."""
        return F.cross_entropy(flat_seeds(logits), flat_seeds(y), reduction="none").view(y.shape).mean(1)

    @classmethod
    def refuses(cls, cfg: RunSettings) -> str | None:
        """Why a run with these settings does not stack although its method does (None: it stacks)."""
        return None

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
        examples = self.ctx.train_transform(flat_seeds(out[0]))
        return (examples.view(*out[0].shape[:2], *examples.shape[1:]), *out[1:])


class StackedSGD(StackedMethod):
    name = "sgd"

    def observe(self, x, y, x_raw):
        return self.sgd_step(self.cross_entropy(self.net(x), y))


class StackedER(StackedMethod):
    name = "er"
    uses_buffer = True

    def observe(self, x, y, x_raw):
        inputs, labels = x, y
        if not self.buffer.is_empty():
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            inputs, labels = torch.cat([x, buf_x], 1), torch.cat([y, buf_y], 1)
        loss = self.sgd_step(self.cross_entropy(self.net(inputs), labels))
        self.buffer.add(examples=x_raw, labels=y)
        return loss


class StackedDER(StackedMethod):
    """DER and DER++ (gcl.methods.der): stream CE + alpha * MSE to stored logits + beta * CE on a second batch."""

    name = "der"
    uses_buffer = True

    def __init__(self, net, cfg, lone):
        super().__init__(net, cfg, lone)
        self.beta = getattr(cfg, "beta", 0.0)      # plain DER has no label term

    def observe(self, x, y, x_raw):
        logits = self.net(x)
        loss = self.cross_entropy(logits, y)
        if not self.buffer.is_empty():
            size = self.cfg.replay_batch
            buf_x, buf_logits = self.replay_batch(size, "logits")
            loss = loss + self.cfg.alpha * (self.net(buf_x) - buf_logits).pow(2).mean((1, 2))   # each seed's MSE
            if self.beta > 0:
                buf_x2, buf_y2 = self.replay_batch(size, "labels")      # an independent draw
                loss = loss + self.beta * self.cross_entropy(self.net(buf_x2), buf_y2)
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y, logits=logits.detach())
        return loss


class StackedDERpp(StackedDER):
    name = "derpp"


class StackedERACE(StackedMethod):
    """ER-ACE (gcl.methods.erace): the stream batch's cross-entropy over each seed's own present and unclaimed
    classes, the replayed batch's over all classes."""

    name = "er-ace"
    uses_buffer = True

    def __init__(self, net, cfg, lone):
        super().__init__(net, cfg, lone)
        self.seen = torch.zeros(self.seeds, self.ctx.n_classes, dtype=torch.bool, device=self.ctx.device)

    def asymmetric_logits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """gcl.methods.erace.asymmetric_logits for every seed: (S, B, classes) with (S, B) labels."""
        n = logits.shape[2]
        classes = torch.arange(n, device=logits.device)
        keep = torch.zeros(self.seeds, n, dtype=torch.bool, device=logits.device).scatter_(1, y, True)
        top = torch.where(self.seen, classes, -1).max(1).values.unsqueeze(1)
        keep |= (classes >= top) & (top < n - 1)
        return logits.masked_fill(~keep.unsqueeze(1), torch.finfo(logits.dtype).min)

    def observe(self, x, y, x_raw):
        self.seen.scatter_(1, y, True)
        logits = self.net(x)
        if self.buffer.is_empty():
            loss = self.cross_entropy(logits, y)
        else:
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            loss = self.cross_entropy(self.asymmetric_logits(logits, y), y) + \
                self.cross_entropy(self.net(buf_x), buf_y)
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        return loss


class StackedCoCa(StackedMethod):
    """CoCa (gcl.methods.coca.method.CoCa) on the MLP, every switch and setting of Table 3: each seed's heads are
    its lone method's (stacked), its buffer batches b2 and b1 and its transformations are drawn from its own
    generator in the lone order (b2, b1, transformations), and its loss is the lone loss of its batches."""

    name = "coca"
    uses_buffer = True

    def __init__(self, net, cfg, lone):
        super().__init__(net, cfg, lone)
        if self.refuses(cfg):
            raise ValueError(self.refuses(cfg))
        self.ckd, self.pt, self.scl = cfg.ckd, cfg.pt, cfg.scl
        self.heads = torch.nn.ModuleDict({name: stack_sequential([m.heads[name] for m in lone])
                                          for name in lone[0].heads})
        self.params += list(self.heads.parameters())

    @classmethod
    def refuses(cls, cfg):
        if cfg.head_norm == "batchnorm":     # on the MLP "auto" means none
            return "CoCa's heads with BatchNorm (head_norm: batchnorm) would normalise the seeds' batches together"
        return None

    def unstack(self, s, lone):
        for name, head in self.heads.items():
            unstack_sequential(head, s, lone.heads[name])

    def _embed(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.heads["projector"](feats), dim=-1)

    def _pretext(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each seed's random transformation of each of its samples, drawn from its own generator (random_pretext's
        draw), applied to every seed's samples at once: (S, N, ...) views and (S, N) labels."""
        count, variant = inputs.shape[1], self.cfg.pretext
        labels = torch.stack([pretext_labels(count, variant, g, inputs.device) for g in self.generators])
        return apply_pretext(flat_seeds(inputs), flat_seeds(labels), variant).view(inputs.shape), labels

    def observe(self, x, y, x_raw):
        cfg = self.cfg
        buf_x = buf_y = b1 = None
        if not self.buffer.is_empty():
            buf_x, buf_y = self.replay_batch(cfg.replay_batch, "labels")          # b2
            if self.ckd:
                b1 = self.replay_batch(cfg.replay_batch, "logits")            # b1
        inputs = x if buf_x is None else torch.cat([x, buf_x], 1)
        labels = y if buf_y is None else torch.cat([y, buf_y], 1)
        x_view = None
        if self.pt or self.scl:
            x_view, pt_labels = self._pretext(inputs)
        roles = [x] + [r for r in (buf_x, None if b1 is None else b1[0], x_view) if r is not None]
        # the MLP has no BatchNorm: one forward of the roles side by side, as the lone method takes it
        f_x, *rest = self.net.features(torch.cat(roles, 1)).split([r.shape[1] for r in roles], 1)
        logits = self.net.classifier(f_x)
        loss = self.cross_entropy(logits, y)
        feats = f_x
        if buf_x is not None:
            f_b2 = rest.pop(0)
            loss = loss + cfg.beta * self.cross_entropy(self.net.classifier(f_b2), buf_y)
            feats = torch.cat([f_x, f_b2], 1)
        if b1 is not None:
            f_b1 = rest.pop(0)
            o = self.net.classifier(f_b1)
            with torch.no_grad():
                z = self._embed(f_b1) if cfg.ckd_embedding == "projector" else F.normalize(f_b1, dim=-1)
                target = collaborative_target(o, b1[1], z, cfg.omega, cfg.gamma, cfg.affinity, cfg.affinity_c)
            loss = loss + cfg.lambda1 * (o - target).pow(2).mean((1, 2))          # each seed's MSE
        if x_view is not None:
            f_view = rest.pop(0)
            css = 0.0
            if self.pt:
                css = css + self.cross_entropy(self.heads["pretext"](f_view), pt_labels)
            if self.scl:
                z = self._embed(torch.cat([feats, f_view], 1))
                css = css + supcon_loss(z, torch.cat([labels, labels], 1), cfg.tau)
            loss = loss + cfg.lambda2 * css
        loss = self.sgd_step(loss)
        fields = {"examples": x_raw, "labels": y}
        if self.ckd:
            fields["logits"] = logits.detach()
        self.buffer.add(**fields)
        return loss


class StackedJoint(StackedMethod):
    """JOINT (gcl.methods.joint): each seed keeps its stream, then trains on it in its own shuffled order."""

    name = "joint"

    def __init__(self, net, cfg, lone):
        super().__init__(net, cfg, lone)
        self.seen_x: list[torch.Tensor] = []
        self.seen_y: list[torch.Tensor] = []

    def observe(self, x, y, x_raw):
        self.seen_x.append(x_raw)
        self.seen_y.append(y)
        return torch.zeros(self.seeds, device=y.device)

    def finish(self):
        xs, ys = torch.cat(self.seen_x, 1), torch.cat(self.seen_y, 1)
        rows = torch.arange(self.seeds, device=xs.device).unsqueeze(1)
        batch, count = self.cfg.batch, xs.shape[1]
        for _ in range(self.ctx.epochs):
            perms = torch.stack([torch.randperm(count, generator=g) for g in self.generators]).to(xs.device)
            for lo in range(0, count, batch):
                idx = perms[:, lo:lo + batch]
                x = self.ctx.train_transform(flat_seeds(xs[rows, idx]))
                self.sgd_step(self.cross_entropy(self.net(x.view(*idx.shape, *x.shape[1:])), ys[rows, idx]))


class StackedAGEM(StackedMethod):
    """A-GEM (gcl.methods.agem): each seed's stream gradient projected against its own reference gradient."""

    name = "agem"
    uses_buffer = True

    def _flat_grads(self, per_seed: torch.Tensor) -> torch.Tensor:
        """Each seed's gradient of its own loss, flattened: (S, P) (no parameter is shared between seeds)."""
        grads = torch.autograd.grad(per_seed.sum(), self.params)
        return torch.cat([g.reshape(self.seeds, -1) for g in grads], 1)

    def observe(self, x, y, x_raw):
        loss = self.cross_entropy(self.net(x), y)
        if self.buffer.is_empty():
            self.sgd_step(loss)
        else:
            g = self._flat_grads(loss)
            if self.cfg.reference_input == "raw":
                buf_raw, buf_y = self.buffer.sample(self.cfg.replay_batch, "examples", "labels")
                buf_x = to_unit_float(buf_raw)
            else:
                buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            g_ref = self._flat_grads(self.cross_entropy(self.net(buf_x), buf_y))
            sizes = [p[0].numel() for p in self.params]
            for p, gp in zip(self.params, torch.split(project(g, g_ref), sizes, 1)):
                p.grad = gp.reshape(p.shape)
            self.apply_gradients()
        self.buffer.add(examples=x_raw, labels=y)
        return loss.detach()


class StackedCLSER(StackedMethod):
    """CLS-ER (gcl.methods.clser) on the MLP: each seed's plastic and stable memories (stacked), its two update
    draws a step from its own generator, each memory moved only in the seeds whose draw says so."""

    name = "clser"
    uses_buffer = True

    def __init__(self, net, cfg, lone):
        super().__init__(net, cfg, lone)
        self.plastic = StackedMLP([m.plastic for m in lone]).requires_grad_(False)
        self.stable = StackedMLP([m.stable for m in lone]).requires_grad_(False)
        self.global_step = lone[0].global_step
        self._net_params = list(net.parameters())

    def unstack(self, s, lone):
        self.plastic.unstack(s, lone.plastic)
        self.stable.unstack(s, lone.stable)
        lone.global_step = self.global_step

    def observe(self, x, y, x_raw):
        cfg = self.cfg
        if self.buffer.is_empty():
            loss = self.cross_entropy(self.net(x), y)
        else:
            buf_x, buf_y = self.replay_batch(cfg.replay_batch, "labels")
            with torch.no_grad():
                target = memory_targets(flat_seeds(self.stable(buf_x)), flat_seeds(self.plastic(buf_x)),
                                        flat_seeds(buf_y)).view(*buf_y.shape, -1)
            consistency = (self.net(buf_x) - target).pow(2).mean((1, 2))
            ce = self.cross_entropy(self.net(torch.cat([x, buf_x], 1)), torch.cat([y, buf_y], 1))
            loss = cfg.reg_weight * consistency + ce
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        self.global_step += 1
        draws = torch.tensor([memory_draws(g) for g in self.generators], dtype=torch.float64)
        self._update(self.plastic, cfg.plastic_alpha, draws[:, 0] < cfg.plastic_update_freq)
        self._update(self.stable, cfg.stable_alpha, draws[:, 1] < cfg.stable_update_freq)
        return loss

    @torch.no_grad()
    def _update(self, memory: StackedMLP, alpha: float, chosen: torch.Tensor) -> None:
        """memory <- a memory + (1 - a) net in the chosen seeds (CLSER.update_memory), the others left as they are."""
        if not bool(chosen.any()):
            return
        a = memory_decay(self.global_step, alpha)
        dtype = self._net_params[0].dtype
        # the lone update's two factors, a and 1 - a, each rounded once to the weights' type; 1 and 0 elsewhere
        keep, move = (torch.where(chosen, f, other).to(dtype).to(self.ctx.device)
                      for f, other in ((a, 1.0), (1.0 - a, 0.0)))
        for m, p in zip(memory.parameters(), self._net_params):
            shape = (-1, *[1] * (m.dim() - 1))
            m.mul_(keep.view(shape)).add_(p * move.view(shape))
        weights_changed()


STACKED: dict[str, type[StackedMethod]] = {
    cls.name: cls for cls in (StackedSGD, StackedJoint, StackedER, StackedERACE, StackedAGEM, StackedDER,
                              StackedDERpp, StackedCoCa, StackedCLSER)}
