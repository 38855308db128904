"""Stacked CoCa (gcl.methods.coca.method.CoCa)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gcl.core.stacked import flat_seeds, stack_sequential, unstack_sequential
from gcl.methods.coca.method import collaborative_target, head_output, replay_batches, supcon_loss
from gcl.methods.coca.pretext import apply_pretext, pretext_labels
from gcl.methods.stacked.base import StackedMethod


class StackedCoCa(StackedMethod):
    """CoCa (gcl.methods.coca.method.CoCa), every switch and setting of Table 3: each seed's heads are its lone
    method's (stacked, BatchNorm included), its buffer batches b2 and b1 and its transformations are drawn from its
    own generator in the lone order (b2, b1, transformations), and its loss is the lone loss of its batches; with
    BatchNorm in the backbone one forward per role, as alone."""

    name = "coca"
    uses_buffer = True
    state_attrs = ("heads",)

    def __init__(self, net, cfg, lone, transform=None):
        super().__init__(net, cfg, lone, transform)
        self.ckd, self.pt, self.scl = cfg.ckd, cfg.pt, cfg.scl
        self._per_role_forward, self._heads_batchnorm = lone[0]._per_role_forward, lone[0]._heads_batchnorm
        self.heads = torch.nn.ModuleDict({name: stack_sequential([m.heads[name] for m in lone])
                                          for name in lone[0].heads})
        self.params += list(self.heads.parameters())

    def unstack(self, s, lone):
        for name, head in self.heads.items():
            unstack_sequential(head, s, lone.heads[name])

    def _features(self, roles: list[torch.Tensor]) -> list[torch.Tensor]:
        """CoCa._features with the seed dimension in front: one forward per role with BatchNorm, else one."""
        if self._per_role_forward:
            return [self.net.features(r) for r in roles]
        return list(self.net.features(torch.cat(roles, 1)).split([r.shape[1] for r in roles], 1))

    def _head(self, name: str, feats: torch.Tensor) -> torch.Tensor:
        return head_output(self.heads[name], feats, self._heads_batchnorm, batch_dim=1)

    def _embed(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(self._head("projector", feats), dim=-1)

    def _pretext(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each seed's random transformation of each of its samples, drawn from its own generator (random_pretext's
        draw), applied to every seed's samples at once: (S, N, ...) views and (S, N) labels."""
        count, variant = inputs.shape[1], self.cfg.pretext
        labels = torch.stack([pretext_labels(count, variant, g, inputs.device) for g in self.generators])
        return apply_pretext(flat_seeds(inputs), flat_seeds(labels), variant).view(inputs.shape), labels

    def observe(self, x, y, x_raw):
        cfg = self.cfg
        buf_x, buf_y, b1, inputs, labels = replay_batches(self, x, y, dim=1)
        x_view = None
        if self.pt or self.scl:
            x_view, pt_labels = self._pretext(inputs)
        roles = [x] + [r for r in (buf_x, None if b1 is None else b1[0], x_view) if r is not None]
        f_x, *rest = self._features(roles)
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
                css = css + self.cross_entropy(self._head("pretext", f_view), pt_labels)
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
