"""A character-level language model: embedding, a stacked LSTM, and a linear decoder that
predicts the next symbol at every position (the gTop-k paper's LSTM-PTB, scaled down)."""

from __future__ import annotations

import torch
from torch import nn


class CharLSTM(nn.Module):
    """(batch, time) symbol ids → (batch, time, vocab) logits for the next symbol."""

    def __init__(self, vocab: int, embed: int = 64, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.decoder(out)


def lstm(classes: int = 256, embed: int = 64, hidden: int = 256, layers: int = 2) -> nn.Module:
    """A 2-layer LSTM over ``classes`` symbols (the vocabulary); 0.9 M parameters at 100."""
    return CharLSTM(classes, embed, hidden, layers)
