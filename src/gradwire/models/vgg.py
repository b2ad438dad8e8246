"""VGG-16 (Simonyan & Zisserman 2015, configuration D), as the CIFAR variants train it: thirteen
3×3 convolutions, then a 512-512-classes classifier, with batch normalisation optional."""

from __future__ import annotations

from torch import nn

# Configuration D: channels per convolution, "M" for a 2×2 max-pool.
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(classes: int = 10, in_channels: int = 1, input_size: int = 8,
          batch_norm: bool = True) -> nn.Module:
    """VGG-16 for ``input_size``×``input_size`` images: a max-pool that would take the feature
    map below 1×1 is left out (8×8 inputs keep the first three of five), so every convolution
    of configuration D stays; 15.2 M parameters at 10 classes."""
    layers: list[nn.Module] = []
    cin, size = in_channels, input_size
    for v in VGG16:
        if v == "M":
            if size >= 2:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            continue
        layers.append(nn.Conv2d(cin, int(v), 3, padding=1, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm2d(int(v)))
        layers.append(nn.ReLU(inplace=True))
        cin = int(v)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(cin, 512), nn.ReLU(inplace=True),
                         nn.Linear(512, 512), nn.ReLU(inplace=True),
                         nn.Linear(512, classes))
