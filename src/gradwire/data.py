"""Real data that ships inside installed packages: no downloads at run time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


def digits(seed: int = 0, test_fraction: float = 0.2) -> tuple[Split, Split]:
    """scikit-learn's 8x8 handwritten digits (1797 images, read from the installed wheel).

    Pixels are scaled to [0, 1]; the train/test split is a fixed permutation of ``seed``.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n_test = int(len(y) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    return Split(x[train], y[train]), Split(x[test], y[test])


def shard_indices(n: int, rank: int, world: int, epoch: int, seed: int) -> torch.Tensor:
    """This rank's share of an epoch: one permutation for all ranks, dealt round-robin.

    Every rank gets the same number of samples (the tail that does not divide is dropped), so
    all ranks run the same number of iterations and no collective waits on a missing peer.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    per_rank = n // world
    return perm[rank : per_rank * world : world]
