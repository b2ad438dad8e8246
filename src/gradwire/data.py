"""Real data that ships inside installed packages: no downloads at run time."""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gradwire.check import check_int, is_int, is_real
from gradwire.errors import GradwireError


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
    check_int("digits", "seed", seed, 0)
    _check_test_fraction("digits", test_fraction)
    pixels, labels = digits_arrays()
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n_test = int(len(y) * test_fraction)
    if n_test == 0:
        # 1/1797 to three digits rounded up: rounded to nearest (0.000556), it was refused too
        scale = 10 ** (2 - math.floor(math.log10(1 / len(y))))
        least = math.ceil(scale / len(y)) / scale
        raise GradwireError(f"digits: test_fraction {test_fraction:g} of {len(y)} samples leaves "
                            f"the test split empty: expected at least {least:g}")
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
    Python installation always yields the same bytes, and no download is needed. Two builds
    of one version can differ: ``_sysconfigdata_*.py``, written when Python is built (install
    paths, compiler flags), falls within the default 512 KB.
    """
    # a negative budget sliced from each file's end and returned a file's worth of bytes
    check_int("stdlib_source", "budget", budget, 0)
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
    _check_test_fraction("text", test_fraction)
    raw = stdlib_source(budget)
    vocab = bytes(sorted(set(raw)))
    lookup = torch.zeros(256, dtype=torch.int64)
    lookup[torch.tensor(list(vocab))] = torch.arange(len(vocab))
    ids = lookup[torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()]
    cut = int(len(ids) * (1 - test_fraction))
    train, test = ids[:cut], ids[cut:]
    for name, part, more in (("training", train, "smaller"), ("test", test, "larger")):
        # a window needs seq_len symbols and the one after its last
        if len(part) <= seq_len:
            raise GradwireError(f"text: the {name} split's {len(part)} symbols hold no window "
                                f"of seq_len {seq_len}: expected a larger budget (got "
                                f"{budget}), a {more} test_fraction (got {test_fraction:g}) "
                                "or a shorter seq_len")
    return _windows(train, seq_len), _windows(test, seq_len), vocab


def _check_test_fraction(what: str, fraction: object) -> None:
    """A test fraction in (0, 1): 0 or 1 leaves a split empty; outside, the cut index goes
    negative or past the end and the splits come out of the wrong sizes without a word."""
    if not is_real(fraction, 0, 1, above=True) or fraction == 1:
        raise GradwireError(f"{what}: test_fraction must be a number in (0, 1), got {fraction!r}")


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
    check_int("shard_indices", "n", n, 0)
    check_int("shard_indices", "world", world, 1)
    check_int("shard_indices", "epoch", epoch, 0)
    check_int("shard_indices", "seed", seed, 0)
    # a rank past the world would be dealt another rank's samples, a negative one a single one
    if not is_int(rank, 0, world - 1):
        raise GradwireError(f"shard_indices: rank must be an integer from 0 to {world - 1} "
                            f"(world {world}), got {rank!r}")
    # within the 64 bits manual_seed takes (a larger seed raised ValueError)
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % 2**64)
    perm = torch.randperm(n, generator=g)
    per_rank = n // world
    return perm[rank : per_rank * world : world]
