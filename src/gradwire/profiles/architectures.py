"""Parameter tensors of the built-in profiles' networks, derived from their definitions.

Each function lists a network's parameter tensors as (name, shape) in registration order,
which is the order of the forward pass; backward produces gradients in the reverse order. Shapes
are PyTorch's: conv weight (cout, cin, kh, kw), linear weight (cout, cin), embedding
(rows, hidden), bias and norm scale/shift (c,). The
definitions follow the reference implementations named in each docstring (torchvision for the
CNNs, Hugging Face ``BertModel`` for BERT) so the totals can be checked against published
counts; ``tests/test_perf_profiles.py`` holds every total.

``python -m gradwire.profiles.architectures`` rewrites the ``params`` of the built-in profile files
(``profiles/builtin/*.json``) from these definitions, keeping their compute times and sources.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path

from gradwire.errors import lookup
from gradwire.profiles import parse

Shape = tuple[int, ...]
Tensors = list[tuple[str, Shape]]


def conv(name: str, cin: int, cout: int, kh: int, kw: int | None = None,
         bias: bool = False) -> Tensors:
    out = [(f"{name}.weight", (cout, cin, kh, kh if kw is None else kw))]
    return out + [(f"{name}.bias", (cout,))] if bias else out


def norm(name: str, c: int) -> Tensors:
    """BatchNorm or LayerNorm: a scale and a shift per channel (running statistics are buffers)."""
    return [(f"{name}.weight", (c,)), (f"{name}.bias", (c,))]


def linear(name: str, cin: int, cout: int) -> Tensors:
    return [(f"{name}.weight", (cout, cin)), (f"{name}.bias", (cout,))]


def conv_bn(name: str, cin: int, cout: int, kh: int, kw: int | None = None) -> Tensors:
    return conv(f"{name}.conv", cin, cout, kh, kw) + norm(f"{name}.bn", cout)


def resnet_cifar(blocks: int = 3, classes: int = 10) -> Tensors:
    """ResNet-20 (blocks=3) of He et al. 2016 §4.2: 16/32/64 channels, zero-padding (option A)
    shortcuts, so no shortcut parameters: 269,722 at blocks=3."""
    out = conv_bn("stem", 3, 16, 3)
    cin = 16
    for s, cout in enumerate((16, 32, 64)):
        for b in range(blocks):
            name = f"layer{s + 1}.{b}"
            out += conv_bn(f"{name}.1", cin, cout, 3) + conv_bn(f"{name}.2", cout, cout, 3)
            cin = cout
    return out + linear("fc", 64, classes)


def resnet_imagenet(layers: tuple[int, int, int, int], classes: int = 1000) -> Tensors:
    """Bottleneck ResNet as torchvision's ``resnet50``/``resnet101`` (v1.5): 7×7 stem, stages of
    ``layers`` bottlenecks of widths 64…512 (×4 out), a 1×1 projection on each stage's first
    block. (3,4,6,3): 25,557,032; (3,4,23,3): 44,549,160; (3,24,36,3) is ResNet-200."""
    out = conv("conv1", 3, 64, 7) + norm("bn1", 64)
    cin = 64
    for s, (n, width) in enumerate(zip(layers, (64, 128, 256, 512), strict=True)):
        for b in range(n):
            name = f"layer{s + 1}.{b}"
            out += (conv_bn(f"{name}.1", cin, width, 1) + conv_bn(f"{name}.2", width, width, 3)
                    + conv_bn(f"{name}.3", width, 4 * width, 1))
            if b == 0:
                out += conv_bn(f"{name}.downsample", cin, 4 * width, 1)
            cin = 4 * width
    return out + linear("fc", 2048, classes)


def vgg16(classes: int = 1000) -> Tensors:
    """VGG-16 (configuration D) as torchvision's ``vgg16``, no batch norm: 138,357,544."""
    out: Tensors = []
    cin = 3
    for i, cout in enumerate((64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512)):
        out += conv(f"features.{i}", cin, cout, 3, bias=True)
        cin = cout
    return (out + linear("classifier.0", 512 * 7 * 7, 4096) + linear("classifier.3", 4096, 4096)
            + linear("classifier.6", 4096, classes))


def alexnet(classes: int = 1000) -> Tensors:
    """AlexNet as torchvision's ``alexnet`` (the one-tower variant of Krizhevsky 2014):
    61,100,840."""
    out: Tensors = []
    for i, (cin, cout, k) in enumerate(((3, 64, 11), (64, 192, 5), (192, 384, 3),
                                        (384, 256, 3), (256, 256, 3))):
        out += conv(f"features.{i}", cin, cout, k, bias=True)
    return (out + linear("classifier.1", 256 * 6 * 6, 4096) + linear("classifier.4", 4096, 4096)
            + linear("classifier.6", 4096, classes))


def _inception_a(n: str, cin: int, pool: int) -> Tensors:
    return (conv_bn(f"{n}.branch1x1", cin, 64, 1) + conv_bn(f"{n}.branch5x5_1", cin, 48, 1)
            + conv_bn(f"{n}.branch5x5_2", 48, 64, 5) + conv_bn(f"{n}.branch3x3dbl_1", cin, 64, 1)
            + conv_bn(f"{n}.branch3x3dbl_2", 64, 96, 3) + conv_bn(f"{n}.branch3x3dbl_3", 96, 96, 3)
            + conv_bn(f"{n}.branch_pool", cin, pool, 1))


def _inception_c(n: str, c7: int) -> Tensors:
    cin = 768
    return (conv_bn(f"{n}.branch1x1", cin, 192, 1) + conv_bn(f"{n}.branch7x7_1", cin, c7, 1)
            + conv_bn(f"{n}.branch7x7_2", c7, c7, 1, 7)
            + conv_bn(f"{n}.branch7x7_3", c7, 192, 7, 1)
            + conv_bn(f"{n}.branch7x7dbl_1", cin, c7, 1)
            + conv_bn(f"{n}.branch7x7dbl_2", c7, c7, 7, 1)
            + conv_bn(f"{n}.branch7x7dbl_3", c7, c7, 1, 7)
            + conv_bn(f"{n}.branch7x7dbl_4", c7, c7, 7, 1)
            + conv_bn(f"{n}.branch7x7dbl_5", c7, 192, 1, 7)
            + conv_bn(f"{n}.branch_pool", cin, 192, 1))


def _inception_e(n: str, cin: int) -> Tensors:
    return (conv_bn(f"{n}.branch1x1", cin, 320, 1) + conv_bn(f"{n}.branch3x3_1", cin, 384, 1)
            + conv_bn(f"{n}.branch3x3_2a", 384, 384, 1, 3)
            + conv_bn(f"{n}.branch3x3_2b", 384, 384, 3, 1)
            + conv_bn(f"{n}.branch3x3dbl_1", cin, 448, 1)
            + conv_bn(f"{n}.branch3x3dbl_2", 448, 384, 3)
            + conv_bn(f"{n}.branch3x3dbl_3a", 384, 384, 1, 3)
            + conv_bn(f"{n}.branch3x3dbl_3b", 384, 384, 3, 1)
            + conv_bn(f"{n}.branch_pool", cin, 192, 1))


def inception_v3(classes: int = 1000) -> Tensors:
    """Inception-v3 as torchvision's ``inception_v3`` with its auxiliary classifier (trained,
    so its gradients travel): 27,161,264 (23,834,568 without the auxiliary head)."""
    out = (conv_bn("Conv2d_1a_3x3", 3, 32, 3) + conv_bn("Conv2d_2a_3x3", 32, 32, 3)
           + conv_bn("Conv2d_2b_3x3", 32, 64, 3) + conv_bn("Conv2d_3b_1x1", 64, 80, 1)
           + conv_bn("Conv2d_4a_3x3", 80, 192, 3))
    out += (_inception_a("Mixed_5b", 192, 32) + _inception_a("Mixed_5c", 256, 64)
            + _inception_a("Mixed_5d", 288, 64))
    out += (conv_bn("Mixed_6a.branch3x3", 288, 384, 3)
            + conv_bn("Mixed_6a.branch3x3dbl_1", 288, 64, 1)
            + conv_bn("Mixed_6a.branch3x3dbl_2", 64, 96, 3)
            + conv_bn("Mixed_6a.branch3x3dbl_3", 96, 96, 3))
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        out += _inception_c(name, c7)
    out += (conv_bn("AuxLogits.conv0", 768, 128, 1) + conv_bn("AuxLogits.conv1", 128, 768, 5)
            + linear("AuxLogits.fc", 768, classes))
    out += (conv_bn("Mixed_7a.branch3x3_1", 768, 192, 1)
            + conv_bn("Mixed_7a.branch3x3_2", 192, 320, 3)
            + conv_bn("Mixed_7a.branch7x7x3_1", 768, 192, 1)
            + conv_bn("Mixed_7a.branch7x7x3_2", 192, 192, 1, 7)
            + conv_bn("Mixed_7a.branch7x7x3_3", 192, 192, 7, 1)
            + conv_bn("Mixed_7a.branch7x7x3_4", 192, 192, 3))
    out += _inception_e("Mixed_7b", 1280) + _inception_e("Mixed_7c", 2048)
    return out + linear("fc", 2048, classes)


def bert(layers: int = 12, hidden: int = 768, ffn: int = 3072, vocab: int = 30522,
         positions: int = 512) -> Tensors:
    """BERT-base encoder as Hugging Face ``BertModel`` (bert-base-uncased: embeddings, 12
    layers, pooler; no pre-training heads): 109,482,240."""
    out = [("embeddings.word", (vocab, hidden)), ("embeddings.position", (positions, hidden)),
           ("embeddings.token_type", (2, hidden))] + norm("embeddings.LayerNorm", hidden)
    for i in range(layers):
        n = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            out += linear(f"{n}.attention.self.{part}", hidden, hidden)
        out += linear(f"{n}.attention.output.dense", hidden, hidden)
        out += norm(f"{n}.attention.output.LayerNorm", hidden)
        out += linear(f"{n}.intermediate.dense", hidden, ffn)
        out += linear(f"{n}.output.dense", ffn, hidden) + norm(f"{n}.output.LayerNorm", hidden)
    return out + linear("pooler.dense", hidden, hidden)


ARCHITECTURES: dict[str, Callable[[], Tensors]] = {
    "resnet20": resnet_cifar,
    "resnet50": lambda: resnet_imagenet((3, 4, 6, 3)),
    "resnet101": lambda: resnet_imagenet((3, 4, 23, 3)),
    "resnet200": lambda: resnet_imagenet((3, 24, 36, 3)),
    "vgg16": vgg16,
    "alexnet": alexnet,
    "inception-v3": inception_v3,
    "bert-base": bert,
}


def _backward(name: str) -> Tensors:
    """The tensors of ``name`` in backward order; an unknown name is a one-line error."""
    return lookup(ARCHITECTURES, name, "architecture")()[::-1]


def backward_order(name: str) -> list[tuple[str, int]]:
    """The parameter tensors of ``name`` as (name, elements), in the order backward produces
    their gradients."""
    return [(n, math.prod(shape)) for n, shape in _backward(name)]


def backward_shapes(name: str) -> list[Shape]:
    """The shapes of the tensors of :func:`backward_order`, in the same order."""
    return [shape for _, shape in _backward(name)]


def main(directory: Path) -> None:
    """Rewrite ``params`` of every built-in profile file in ``directory`` from its definition."""
    for name in ARCHITECTURES:
        path = directory / f"{name}.json"
        # UTF-8 whatever the locale: the files are JSON, and to_text keeps non-ASCII as is
        profile = parse(path.read_text(encoding="utf-8"), str(path))
        path.write_text(dataclasses.replace(profile, params=tuple(backward_order(name)),
                                            shapes=tuple(backward_shapes(name))).to_text(),
                        encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "builtin")
