"""Residual networks: ResNet-20 (He et al. 2016, §4.2, the CIFAR family) and ResNet-50 (the
ImageNet bottleneck network), both with a stem that can take 8×8 inputs.

ResNet-20 at CIFAR width has 0.27 M parameters (here 1×1-convolution shortcuts, option B, where
the paper pads with zeros); ResNet-50 at ImageNet width (3 input channels, 1000 classes) has
25,557,032, the gTop-k paper's m = 25.6 M.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class BasicBlock(nn.Module):
    """Two 3×3 convolutions and an identity (or 1×1 projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, cout, 3, stride), nn.ReLU(inplace=True),
                                  *_conv_bn(cout, cout, 3))
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3 (carrying the stride, as torchvision's v1.5 does), 1×1 expand ×4."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*_conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                                  *_conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                                  *_conv_bn(width, cout, 1))
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def _head(channels: int, classes: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]


def resnet20(classes: int = 10, in_channels: int = 1) -> nn.Module:
    """ResNet-20: a 3×3 stem, three stages of three basic blocks (16, 32, 64 channels; strides
    1, 2, 2), global average pooling. An 8×8 input leaves the stages at 2×2."""
    layers: list[nn.Module] = [*_conv_bn(in_channels, 16, 3), nn.ReLU(inplace=True)]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
            cin = cout
    return nn.Sequential(*layers, *_head(cin, classes))


def resnet50(classes: int = 1000, in_channels: int = 3, small_input: bool = False) -> nn.Module:
    """ResNet-50: stages of 3, 4, 6 and 3 bottlenecks (widths 64…512, outputs 256…2048).

    ``small_input`` swaps the ImageNet stem (7×7 stride 2, then 3×3 max-pool stride 2) for one
    3×3 stride-1 convolution, so an 8×8 input reaches the last stage at 1×1 instead of vanishing.
    The stem changes the parameter count by (49 − 9)·64·``in_channels`` weights only.
    """
    if small_input:
        stem: list[nn.Module] = [*_conv_bn(in_channels, 64, 3), nn.ReLU(inplace=True)]
    else:
        stem = [*_conv_bn(in_channels, 64, 7, 2), nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1)]
    layers = stem
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * Bottleneck.expansion
    return nn.Sequential(*layers, *_head(cin, classes))
