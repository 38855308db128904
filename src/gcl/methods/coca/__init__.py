"""CoCa (complementary calibration), in two parts: the method (method: its losses, heads and step) and the
geometric pretext tasks its self-supervision learns (pretext). The paper's equations, the authors' code and
where this implementation departs from either are described in gcl.methods.coca.method."""
from gcl.methods.coca.method import (  # noqa: F401
    AFFINITIES,
    CoCa,
    CoCaSettings,
    affinity,
    ckd_loss,
    collaborative_target,
    mlp_head,
    projection_dim,
    propagate,
    supcon_loss,
)
from gcl.methods.coca.pretext import apply_pretext, n_pretext_classes, random_pretext  # noqa: F401
