"""Experience Replay with a reservoir buffer: one cross-entropy over the stream batch and a replayed batch."""
import torch
import torch.nn.functional as F

from gcl.methods.base import Method, ReplaySettings, register


@register
class ER(Method):
    name = "er"
    capturable = True
    summary = "Experience Replay: one cross-entropy over the stream batch and a reservoir buffer batch"
    uses_buffer = True
    Settings = ReplaySettings

    def observe(self, x, y, x_raw):
        inputs, labels = x, y
        if not self.buffer.is_empty():
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            inputs, labels = torch.cat([x, buf_x]), torch.cat([y, buf_y])
        loss = self.sgd_step(F.cross_entropy(self.net(inputs), labels))
        self.buffer.add(examples=x_raw, labels=y)
        return loss
