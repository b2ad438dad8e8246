"""Real data that ships inside installed packages: no downloads at run time."""

from __future__ import annotations

import gzip
import importlib.util
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gradwire.check import check_int


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
    pixels, labels = digits_arrays()
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n_test = int(len(y) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    return Split(x[train], y[train]), Split(x[test], y[test])


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (1797 x 64, 0 to 16) and labels, exactly as scikit-learn's
    ``load_digits`` gives them. Read straight from the file it reads, inside the installed
    package, because importing ``sklearn.datasets`` adds to every rank's start-up
    (``benchmarks/rank_startup.py`` measures it). Where that file is not in its usual place,
    the loader itself."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root, "datasets", "data", "digits.csv.gz")
        if path.is_file():
            with gzip.open(path, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target


def stdlib_source(budget: int) -> bytes:
    """The first ``budget`` bytes of the Python standard library's own ``.py`` files.

    Files are read in a fixed order (top-level modules first, then packages, names sorted at
    every level; ``site-packages`` skipped) from ``sysconfig.get_paths()["stdlib"]``, so one
    Python version always yields the same bytes, and no download is needed.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    size = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages"))
        for name in sorted(f for f in filenames if f.endswith(".py")):
            try:
                data = (Path(dirpath) / name).read_bytes()
            except OSError:
                continue
            chunks.append(data[: budget - size])
            size += len(chunks[-1])
            if size >= budget:
                return b"".join(chunks)
    return b"".join(chunks)


def text(seq_len: int = 64, budget: int = 512 * 1024,
         test_fraction: float = 0.1) -> tuple[Split, Split, bytes]:
    """Character-level language modelling on :func:`stdlib_source` (``budget`` bytes).

    The vocabulary is every byte value that occurs, sorted; symbols are indices into it. The
    first ``1 - test_fraction`` of the text trains and the rest tests (a split by position, so
    no test sequence overlaps a training one). Each sample is a window of ``seq_len`` symbols,
    ``x``, and the same window shifted by one, ``y`` (the next symbol at every position);
    windows do not overlap. Returns (train, test, vocabulary). The data involves no randomness;
    training order is drawn from the seed by :func:`shard_indices`.
    """
    check_int("text", "seq_len", seq_len, 1)
    check_int("text", "budget", budget, 1)
    raw = stdlib_source(budget)
    vocab = bytes(sorted(set(raw)))
    lookup = torch.zeros(256, dtype=torch.int64)
    lookup[torch.tensor(list(vocab))] = torch.arange(len(vocab))
    ids = lookup[torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()]
    cut = int(len(ids) * (1 - test_fraction))
    return _windows(ids[:cut], seq_len), _windows(ids[cut:], seq_len), vocab


def _windows(ids: torch.Tensor, seq_len: int) -> Split:
    n = (len(ids) - 1) // seq_len
    x = ids[: n * seq_len].view(n, seq_len)
    y = ids[1 : n * seq_len + 1].view(n, seq_len)
    return Split(x.clone(), y.clone())


def shard_indices(n: int, rank: int, world: int, epoch: int, seed: int) -> torch.Tensor:
    """This rank's share of an epoch: one permutation for all ranks, dealt round-robin.

    Every rank gets the same number of samples (the tail that does not divide is dropped), so
    all ranks run the same number of iterations and no collective waits on a missing peer.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    per_rank = n // world
    return perm[rank : per_rank * world : world]
