"""What a model trains on and how it is scored: the data set its registry entry names, the
batches, the loss and the metrics. Digits and text share one path: a model's output has the
classes (or the vocabulary) in its last dimension and the labels have the other dimensions."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gradwire.data import Split, digits, text
from gradwire.models import ModelSpec


@dataclass
class Task:
    train: Split
    test: Split
    classes: int  # labels, or the vocabulary's size for text
    kind: str  # "digits" or "text"

    def batch(self, split: Split, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return split.x[idx], split.y[idx]


def load_task(spec: ModelSpec, seed: int, seq_len: int = 64) -> Task:
    """The data ``spec`` trains on, with inputs shaped as the model takes them."""
    if spec.data == "text":
        train, test, vocab = text(seq_len)
        return Task(train, test, len(vocab), "text")
    train, test = digits(seed)
    shape = spec.input_shape
    return Task(Split(train.x.view(-1, *shape), train.y), Split(test.x.view(-1, *shape), test.y),
                10, "digits")


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction (each position of each text sequence)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, batch: int = 256) -> tuple[float, float]:
    """(mean loss, accuracy) over ``split``; for text, next-symbol accuracy at every position.
    Batch norm runs in eval mode and the model is put back in training mode."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for i in range(0, len(split), batch):
        x, y = split.x[i : i + batch], split.y[i : i + batch]
        logits = model(x)
        loss_sum += loss_fn(logits, y).item() * y.numel()
        correct += int((logits.argmax(-1) == y).sum())
        count += y.numel()
    model.train()
    return loss_sum / max(count, 1), correct / max(count, 1)


def perplexity(loss: float) -> float:
    """exp(loss) for a loss in nats per symbol; inf where it would overflow (a NaN loss, a
    diverged run's, stays NaN: it was inf, as if the loss had only been large)."""
    return math.inf if loss >= 700 else math.exp(loss)


def optimizer(params: Iterable[nn.Parameter], lr: float, momentum: float) -> torch.optim.SGD:
    """Momentum SGD as every gradwire run steps it: torch's fused kernel where this torch has
    one for the parameters' device (one pass over each parameter instead of three), else the
    per-tensor loop. Trainer and performance model use this one, so they time the same step."""
    params = list(params)
    try:
        return torch.optim.SGD(params, lr=lr, momentum=momentum, fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused SGD for this torch or device
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
