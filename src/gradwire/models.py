"""Models defined in the project (no torchvision here), sized for the demo's data."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gradwire.errors import GradwireError


def mlp(in_features: int = 64, classes: int = 10, hidden: int = 1024, depth: int = 2) -> nn.Module:
    """A ReLU MLP; the default (64-1024-1024-10) has 1.12 M parameters, a 4.5 MB fp32 gradient."""
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def mlp_small() -> nn.Module:
    """64-128-128-10: 26 k parameters, for quick tests."""
    return mlp(hidden=128)


MODELS: dict[str, Callable[[], nn.Module]] = {"mlp": mlp, "mlp-small": mlp_small}


def build_model(name: str, seed: int = 0) -> nn.Module:
    """Build a registered model with parameters drawn from ``seed`` (identical on every rank)."""
    if name not in MODELS:
        raise GradwireError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name]()


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
