"""SGD: fine-tune on the stream with no defence against forgetting (the lower bound)."""
from gcl.methods.base import Method, register


@register
class SGD(Method):
    name = "sgd"
    capturable = True
    summary = "fine-tuning on the stream, no defence against forgetting (lower bound)"

    def observe(self, x, y, x_raw):
        return self.sgd_step(self.seeds.cross_entropy(self.net(x), y))
