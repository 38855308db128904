"""A-GEM (Chaudhry et al. 2019), reservoir variant: the one usable without task boundaries.

The stream gradient g is projected so that it does not increase the loss on a buffer batch:
if g . g_ref < 0, g <- g - (g . g_ref / ||g_ref||^2) g_ref, with g_ref the gradient on the buffer
batch. The buffer is a reservoir over the stream (no per-task memories, no boundaries).
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from gcl.data.transforms import to_unit_float
from gcl.methods.base import Method, ReplaySettings, register


def project(g: torch.Tensor, g_ref: torch.Tensor) -> torch.Tensor:
    """A-GEM's projection of the flat gradient `g` against the flat reference gradient `g_ref`.

    Branch-free (torch.where), so deciding whether to project needs no host synchronisation. Rows (S, P) of
    stacked seeds (gcl.core.seeds) are projected each against its own reference row.
    """
    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.dot(a, b) if a.dim() == 1 else (a * b).sum(-1, keepdim=True)
    along = dot(g, g_ref)
    # clamp: a zero g_ref gives dot = 0, no projection, and must not put a NaN in the unused branch
    coef = torch.where(along < 0, along / dot(g_ref, g_ref).clamp_min(torch.finfo(g.dtype).tiny),
                       torch.zeros_like(along))
    return g - coef * g_ref


class AGEMSettings(ReplaySettings):
    reference_input: Literal["raw", "replay"] = Field(
        "raw", description="raw: the reference batch as stored, pixels in [0, 1], neither augmented nor normalised "
                           "(the reference framework's A-GEM-R); replay: augmented and normalised like other replays")


@register
class AGEM(Method):
    name = "agem"
    summary = "A-GEM (reservoir): project the gradient so the loss on a buffer batch does not increase"
    uses_buffer = True
    Settings = AGEMSettings

    def observe(self, x, y, x_raw):
        seeds = self.seeds
        loss = seeds.cross_entropy(self.net(x), y)
        if self.buffer.is_empty():
            self.sgd_step(loss)
        else:
            g = seeds.flat_gradient(loss, self.params)
            if self.cfg.reference_input == "raw":
                buf_raw, buf_y = self.buffer.sample(self.cfg.replay_batch, "examples", "labels")
                buf_x = to_unit_float(buf_raw)
            else:
                buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            g_ref = seeds.flat_gradient(seeds.cross_entropy(self.net(buf_x), buf_y), self.params)
            seeds.set_gradient(self.params, project(g, g_ref))   # into .grad, parameter by parameter, and step
            self.apply_gradients()
        self.buffer.add(examples=x_raw, labels=y)
        return loss.detach()
