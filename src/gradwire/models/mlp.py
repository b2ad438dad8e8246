"""Multi-layer perceptrons: the demo's model (most of its parameters in one 1024×1024 layer)."""

from __future__ import annotations

from torch import nn


def mlp(in_features: int = 64, classes: int = 10, hidden: int = 1024, depth: int = 2) -> nn.Module:
    """A ReLU MLP; the default (64-1024-1024-10) has 1.13 M parameters, a 4.5 MB fp32 gradient."""
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)
