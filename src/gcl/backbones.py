"""Backbones: a feature extractor plus a linear classifier, so that methods can reach the features."""
from __future__ import annotations

import math

import torch
from torch import nn


class Backbone(nn.Module):
    """`features(x)` gives the penultimate representation (width `feat_dim`); `forward` the logits."""

    feat_dim: int

    def features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(Backbone):
    """MNIST-360's network: input -> 100 -> ReLU -> 100 -> ReLU -> Linear(100, classes), Xavier-uniform, zero bias."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, hidden: int = 100):
        super().__init__()
        self.feat_dim = hidden
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.classifier = nn.Linear(hidden, n_classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


BACKBONES = {"mlp": MLP}


def build_backbone(name: str, input_shape: tuple[int, ...], n_classes: int) -> Backbone:
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; known backbones: {sorted(BACKBONES)}")
    return BACKBONES[name](tuple(input_shape), n_classes)
