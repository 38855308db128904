"""ER-ACE: Experience Replay with the asymmetric cross-entropy (Caccia, Aljundi, Asadi, Tuytelaars, Pineau,
Belilovsky, "New Insights on Reducing Abrupt Representation Change in Online Continual Learning", ICLR 2022).

The stream batch's cross-entropy runs over the classes present in that batch (and the classes above the
highest one seen so far, which no sample has claimed yet), so new classes do not push the logits of old
ones down; the replayed batch's cross-entropy runs over every class. Without task boundaries: the
reference masks only once its first task has ended; here the mask and the replay start together, once
the buffer holds samples (the second step).
"""
import torch
from pydantic import Field

from gcl.methods.base import Method, MethodContext, ReplaySettings, register


def asymmetric_logits(logits: torch.Tensor, y: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """`logits` of a stream batch with every class masked out (set to the dtype's minimum, so it gets no
    probability and no gradient) unless it is present in `y`, or at or above the highest class in `seen`
    (a boolean mask of the classes seen so far, `y`'s included) while that is not the last class. Stacked seeds:
    logits (S, B, classes), y (S, B) and seen (S, classes), each seed masked by its own."""
    n = logits.shape[-1]
    classes = torch.arange(n, device=logits.device)
    keep = torch.zeros(seen.shape, dtype=torch.bool, device=logits.device).scatter_(-1, y, True)
    top = torch.where(seen, classes, -1).max(-1, keepdim=True).values
    keep |= (classes >= top) & (top < n - 1)        # the reference's mask[:, seen.max():] = 1, unless max is last
    return logits.masked_fill(~keep.unsqueeze(-2), torch.finfo(logits.dtype).min)


class ERACESettings(ReplaySettings):
    # refused in the settings, so that check@runs stops a profile before any training, not train@ hours into a grid
    batch: int = Field(ge=2, description="stream batch size; at least 2: with one image, once every class has been "
                       "seen the asymmetric cross-entropy runs over that image's class alone (a zero loss with no "
                       "gradient), which leaves replay alone")


@register
class ERACE(Method):
    name = "er-ace"
    capturable = True
    summary = ("ER with the asymmetric cross-entropy: the stream batch's loss over the classes in that batch, "
               "the replayed batch's over all classes (Caccia et al., ICLR 2022)")
    uses_buffer = True
    Settings = ERACESettings
    state_attrs = ("seen",)

    def __init__(self, net, cfg: ERACESettings, ctx: MethodContext):
        super().__init__(net, cfg, ctx)
        self.seen = torch.zeros(ctx.n_classes, dtype=torch.bool, device=ctx.device)   # (S, classes) stacked

    def observe(self, x, y, x_raw):
        seeds = self.seeds
        self.seen.scatter_(-1, y, True)
        logits = self.net(x)
        if self.buffer.is_empty():
            loss = seeds.cross_entropy(logits, y)
        else:
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            loss = (seeds.cross_entropy(asymmetric_logits(logits, y, self.seen), y)
                    + seeds.cross_entropy(self.net(buf_x), buf_y))
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        return loss
