"""Models defined in the project (no torchvision), and the one registry the CLI and the trainer
read. Each entry says which data set it trains on and the shape of one input sample.

| name      | data   | parameters | what |
|-----------|--------|------------|------|
| mlp       | digits | 1.13 M     | 64-1024-1024-10 ReLU MLP, the demo's model |
| mlp-small | digits | 26 k       | 64-128-128-10, for quick tests |
| resnet20  | digits | 0.27 M     | CIFAR-style ResNet-20 on 1×8×8 images |
| resnet50  | digits | 23.5 M     | bottleneck ResNet-50, 3×3 stem; 25.56 M at ImageNet width |
| vgg16     | digits | 15.2 M     | VGG-16 with batch norm, pools that fit 8×8 |
| lstm      | text   | 0.9 M      | character LSTM (64-d embedding, 2×256 LSTM) on stdlib source |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from gradwire.check import check_int, is_int
from gradwire.errors import GradwireError, lookup
from gradwire.models.lstm import lstm
from gradwire.models.mlp import mlp
from gradwire.models.resnet import resnet20, resnet50
from gradwire.models.vgg import vgg16


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: ``build(classes)`` makes one for a data set with ``classes`` labels
    (the vocabulary size for text); ``input_shape`` is one sample's shape (text: ``()``, a
    sequence of symbol ids); ``min_batch`` the fewest samples a rank's batch may hold (2 where
    batch norm sees a 1×1 map: one value per channel, which it cannot normalise)."""

    build: Callable[[int], nn.Module]
    description: str
    data: str  # "digits" or "text"
    input_shape: tuple[int, ...]
    min_batch: int = 1


DIGITS_FLAT = (64,)
DIGITS_IMAGE = (1, 8, 8)

MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(lambda c: mlp(classes=c), "64-1024-1024-10 ReLU MLP (the demo's model)",
                     "digits", DIGITS_FLAT),
    "mlp-small": ModelSpec(lambda c: mlp(classes=c, hidden=128), "64-128-128-10 MLP, for tests",
                           "digits", DIGITS_FLAT),
    "resnet20": ModelSpec(lambda c: resnet20(c, 1), "CIFAR-style ResNet-20 on 1×8×8 digits",
                          "digits", DIGITS_IMAGE),
    "resnet50": ModelSpec(lambda c: resnet50(c, 1, small_input=True),
                          "bottleneck ResNet-50 with a 3×3 stem (25.56 M at ImageNet width)",
                          "digits", DIGITS_IMAGE, min_batch=2),
    "vgg16": ModelSpec(lambda c: vgg16(c, 1, 8), "VGG-16 with batch norm, sized for 8×8 digits",
                       "digits", DIGITS_IMAGE, min_batch=2),
    "lstm": ModelSpec(lambda c: lstm(c), "character LSTM: embedding, 2×256 LSTM, linear",
                      "text", ()),
}


def get_spec(name: str) -> ModelSpec:
    return lookup(MODELS, name, "model")


def build_model(name: str, seed: int = 0, classes: int = 10) -> nn.Module:
    """Build a registered model with parameters drawn from ``seed`` (identical on every rank)."""
    spec = get_spec(name)
    check_int("build_model", "classes", classes, 1)
    # the seeds torch's generator takes, less the negative ones, which alias large ones (-1
    # drew what 2**64 - 1 draws); torch refused the rest with a ValueError or RuntimeError
    if not is_int(seed, 0, 2**64 - 1):
        raise GradwireError(f"build_model: seed must be an integer from 0 to 2**64 - 1, got "
                            f"{seed!r}")
    # Draw from the CPU generator seeded, then put back: seeding it for good would reset the
    # caller's random stream, so whatever it drew after building a model would repeat.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return spec.build(classes)


def check_batch(name: str, batch_size: int, what: str = "--batch-size") -> None:
    """A one-line error where ``batch_size`` samples (of option ``what``) are fewer than
    model ``name``'s batch norm needs (:attr:`ModelSpec.min_batch`)."""
    least = get_spec(name).min_batch
    if batch_size < least:
        raise GradwireError(f"{what} {batch_size} is too small for {name}: its batch norm sees "
                            f"a 1×1 map on 8×8 digits, so a rank's batch needs {least} samples "
                            "or more")


def trained_parameters(model: nn.Module, name: str, what: str) -> list[tuple[str, nn.Parameter]]:
    """``model``'s named parameters that get a gradient to send: those that require one and
    hold at least one element (a frozen or empty tensor has nothing to time or to send). None
    is a one-line error naming model ``name`` and the command ``what``."""
    found = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.numel() > 0]
    if not found:
        raise GradwireError(f"{what}: model {name!r} has no parameter to train (every one is "
                            "frozen or empty), so there is no gradient to time")
    return found


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODELS", "ModelSpec", "build_model", "check_batch", "get_spec", "lstm", "mlp",
           "num_parameters", "resnet20", "resnet50", "trained_parameters", "vgg16"]
