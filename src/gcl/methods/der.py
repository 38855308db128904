"""Dark Experience Replay (Buzzega et al. 2020): replay the network's own past logits, not just labels.

DER:   CE(f(x), y) + alpha * MSE(f(x_buf), z_buf), with z the logits stored when x_buf entered the buffer.
DER++: the same + beta * CE(f(x_buf2), y_buf2) on a second buffer batch: an independent draw, each batch its own
forward pass (the DER paper's code, `replay_draw: independent`), or the two halves of one draw of twice the replay
batch, in one forward pass (the ER-ACE paper's code, `replay_draw: split`: disjoint halves, BatchNorm statistics
over both).

DER++ is DER with a label term, so both are one class; `der` simply never reads a beta.
The buffer keeps the non-augmented input, its label and the (pre-update) logits of its stream step.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from gcl.core.seeds import LONE, Seeds
from gcl.methods.base import Method, ReplaySettings, register


def der_loss(logits: torch.Tensor, y: torch.Tensor,
             buf_out: torch.Tensor | None = None, buf_logits: torch.Tensor | None = None, alpha: float = 0.0,
             buf_out2: torch.Tensor | None = None, buf_y2: torch.Tensor | None = None, beta: float = 0.0,
             seeds: Seeds = LONE) -> torch.Tensor:
    """CE on the stream + alpha * logit matching on one buffer batch + beta * CE on another (each seed's).

    The MSE is the mean over batch and classes (F.mse_loss), as in the reference implementation.
    Terms whose tensors are None (an empty buffer, or plain DER's label term) are left out.
    """
    loss = seeds.cross_entropy(logits, y)
    if buf_out is not None:
        loss = loss + alpha * seeds.mse(buf_out, buf_logits)
    if buf_out2 is not None:
        loss = loss + beta * seeds.cross_entropy(buf_out2, buf_y2)
    return loss


class DERSettings(ReplaySettings):
    alpha: float = Field(ge=0, description="weight of the logit-matching (MSE) term on a buffer batch")


class DERppSettings(DERSettings):
    beta: float = Field(ge=0, description="weight of the cross-entropy on a second buffer batch")
    replay_draw: Literal["independent", "split"] = Field(
        "independent", description="independent: two buffer draws of replay_batch, a forward pass each (the DER "
        "paper's code); split: one draw of 2 x replay_batch in one pass, its first half for the logit term, its second "
        "for the label term (the ER-ACE paper's code)")

    @model_validator(mode="after")
    def _split_needs_two(self):
        # after the first step the buffer holds one stream batch: a draw of one sample has no second half
        if self.replay_draw == "split" and self.batch < 2:
            raise ValueError("replay_draw: split needs batch >= 2 (a draw of one buffer sample has no second half); "
                             "use replay_draw: independent")
        return self


@register
class DER(Method):
    name = "der"
    capturable = True
    summary = "Dark Experience Replay: replay the logits stored with each buffer sample (MSE)"
    uses_buffer = True
    Settings = DERSettings
    beta = 0.0   # plain DER has no label term


    def observe(self, x, y, x_raw):
        logits = self.net(x)
        replay = {} if self.buffer.is_empty() else self.replay_terms(self.cfg.replay_batch)
        loss = self.sgd_step(der_loss(logits, y, **replay, seeds=self.seeds))
        # the logits of this step's forward pass, i.e. of the network before this update
        self.buffer.add(examples=x_raw, labels=y, logits=logits.detach())
        return loss

    def replay_terms(self, size: int) -> dict:
        """der_loss's buffer terms: the logit term on a buffer batch (and DER++'s label term on an independent one).
        Separate forward passes, as the reference does: with BatchNorm (the image backbones) a concatenated batch
        would mix the stream's and the buffer's batch statistics."""
        buf_x, buf_logits = self.replay_batch(size, "logits")
        terms = {"buf_out": self.net(buf_x), "buf_logits": buf_logits, "alpha": self.cfg.alpha}
        if self.beta > 0:
            buf_x2, buf_y2 = self.replay_batch(size, "labels")   # an independent draw
            terms.update(buf_out2=self.net(buf_x2), buf_y2=buf_y2, beta=self.beta)
        return terms


@register
class DERpp(DER):
    name = "derpp"
    summary = "DER++: DER plus a cross-entropy on a second buffer batch"
    Settings = DERppSettings

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.beta = cfg.beta

    def replay_terms(self, size: int) -> dict:
        if self.cfg.replay_draw == "independent" or self.beta == 0:
            return super().replay_terms(size)
        # one draw of twice the batch in one pass; chunk(2) gives the first half the extra sample of an odd draw
        buf_x, buf_logits, buf_y = self.replay_batch(2 * size, "logits", "labels")
        out1, out2 = self.seeds.chunk(self.net(buf_x), 2)
        return {"buf_out": out1, "buf_logits": self.seeds.chunk(buf_logits, 2)[0], "alpha": self.cfg.alpha,
                "buf_out2": out2, "buf_y2": self.seeds.chunk(buf_y, 2)[1], "beta": self.beta}
