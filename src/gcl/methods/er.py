"""Experience Replay with a reservoir buffer: a cross-entropy on the stream batch and on a replayed batch.

Two forms of the step (`replay_pass`): the DER framework's (mammoth's `er`), one forward pass and one mean
cross-entropy over the concatenated batches; and the ER-ACE paper's code (`methods/er.py`), a forward pass for
each batch and the sum of the two mean cross-entropies. They differ in BatchNorm's statistics (one batch of 20 or
two of 10) and in the loss's scale (the sum weighs each sample twice as much as the mean over both: with equal
batches the same direction at twice the step).
"""
from typing import Literal

from pydantic import Field

from gcl.methods.base import Method, ReplaySettings, register


class ERSettings(ReplaySettings):
    replay_pass: Literal["joint", "separate"] = Field(
        "joint", description="joint: one forward pass and one mean cross-entropy over the stream and replayed batches "
        "(the DER framework's ER); separate: a pass for each batch, the two mean losses added (the ER-ACE paper's code)")


@register
class ER(Method):
    name = "er"
    capturable = True
    summary = "Experience Replay: a cross-entropy over the stream batch and a reservoir buffer batch"
    uses_buffer = True
    Settings = ERSettings

    def observe(self, x, y, x_raw):
        seeds = self.seeds
        if self.buffer.is_empty():
            loss = seeds.cross_entropy(self.net(x), y)
        else:
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            if self.cfg.replay_pass == "joint":
                loss = seeds.cross_entropy(self.net(seeds.cat([x, buf_x])), seeds.cat([y, buf_y]))
            else:
                loss = seeds.cross_entropy(self.net(x), y) + seeds.cross_entropy(self.net(buf_x), buf_y)
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        return loss
