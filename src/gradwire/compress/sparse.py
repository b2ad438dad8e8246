"""Sparsifiers: send k of the n elements as (index, value) pairs, or values at shared indices.

- ``topk``: the k largest |x| (Aji & Heafield 2017; Algorithm 1 of the gTop-k paper, Shi et al.
  2019). Exact by torch.topk, or by a sampled threshold that is corrected to the same k.
- ``randomk``: k indices drawn from a seed every rank shares (Wangni et al. 2018), so only values
  travel and the payloads of all ranks can be summed by an allreduce.
- ``dgc``: Deep Gradient Compression's sampled threshold (Lin et al. 2018) with a bounded number
  of correction passes and a variable count of selected elements.

Wire: topk k int32 indices (int64 once n ≥ 2**31) and k values in x's dtype, never promoted
(the gTop-k reference code concatenated int64 indices with fp32 values, so 16 bytes per element
instead of 8); randomk k values; dgc ⌈slack·k⌉ padded pairs and one int32 count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradwire.check import check_fraction, check_int, is_real
from gradwire.compress.base import Compressor, Payload, check_input, expect, generator, select_count
from gradwire.compress.select import SAMPLE, SELECTORS, dgc_select, select
from gradwire.dtypes import index_dtype
from gradwire.errors import GradwireError


@dataclass(frozen=True, kw_only=True)
class SparsePayload(Payload):
    indices: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class CountedPayload(SparsePayload):
    """Indices and values padded to a fixed capacity (so every rank sends the same size, as
    gloo's allgather needs); ``count`` says how many are real."""

    count: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class SharedIndexPayload(Payload):
    """Values only; the indices follow from (seed, step), which every rank knows."""

    values: torch.Tensor
    step: int


def _sparse_decompress(indices: torch.Tensor, values: torch.Tensor, numel: int,
                       dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(numel, dtype=dtype, device=values.device)
    return out.index_put_((indices.long(),), values.to(dtype))


def _sparse_params(name: str, density: float | None, k: int | None) -> tuple[float | None,
                                                                           int | None]:
    if density is not None and k is not None:
        raise GradwireError(f"{name}: give density or k, not both (got density={density!r}, "
                            f"k={k!r})")
    if k is not None:  # int: a numpy integer's products wrap (np.uint8(200) · 8 bytes)
        return None, int(check_int(name, "k", k, 1))
    return check_fraction(f"{name}: density", 0.001 if density is None else density), None


class TopK(Compressor):
    """The k largest |x| as (int32 index, value) pairs.

    ``selector="threshold"`` (default) finds the same k elements as ``"exact"`` with about one
    pass over x (on the device path, unless its sample misses: see
    :mod:`gradwire.compress.select`). Measured at 25 M fp32, density
    0.001, 2 CPU threads: see benchmarks/results/compress_speed/latest.json.

    Not associative: ranks select different indices, so payloads are gathered (TopKAllReduce,
    log(P)α + 2(P−1)kβ) or merged pairwise (gTopKAllReduce).

    Example::

        c = TopK(density=0.01)
        payload = c.compress(grad)            # payload.indices int32, payload.values grad.dtype
        dense = c.decompress(payload, grad.numel())
    """

    name = "topk"
    error_feedback = True
    takes_density = True

    def __init__(self, density: float | None = None, k: int | None = None,
                 selector: str = "threshold", sample: float = SAMPLE, seed: int = 0) -> None:
        super().__init__(seed)
        self.density, self.k = _sparse_params(self.name, density, k)
        if selector not in SELECTORS:
            raise GradwireError(f"topk: selector must be 'threshold' or 'exact', got "
                                f"{selector!r}")
        self.selector = selector
        self.sample = check_fraction(f"{self.name}: sample", sample)

    @property
    def params(self) -> dict[str, object]:
        size = {"k": self.k} if self.k is not None else {"density": self.density}
        return {**size, "selector": self.selector}

    def count(self, numel: int) -> int:
        return select_count(numel, self.density, self.k)

    def compress(self, x: torch.Tensor) -> SparsePayload:
        x = check_input(self.name, x)
        n, k = x.numel(), self.count(x.numel())
        g = self._generator(x.device) if self.selector == "threshold" else None
        idx = select(x, k, self.selector, g, self.sample)
        return SparsePayload(dtype=x.dtype, indices=idx.to(index_dtype(n)), values=x[idx])

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, SparsePayload)
        return _sparse_decompress(p.indices, p.values, numel, p.dtype)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return self.count(numel) * (index_dtype(numel).itemsize + dtype.itemsize)


def random_indices(numel: int, k: int, g: torch.Generator) -> torch.Tensor:
    """k distinct indices in [0, numel), uniformly random, on the CPU (so ranks on different
    devices agree). O(k log k) for k < numel/2: the first k distinct of ~k·1.05 draws."""
    if 2 * k >= numel:
        return torch.randperm(numel, generator=g)[:k]
    draws = torch.empty(0, dtype=torch.long)
    want = math.ceil(-numel * math.log1p(-k / numel) * 1.05) + 16
    while True:
        draws = torch.cat([draws, torch.randint(numel, (want,), generator=g)])
        uniq, inverse = torch.unique(draws, return_inverse=True)
        if uniq.numel() >= k:
            break
        want = 2 * (k - uniq.numel()) + 16
    first = torch.full((uniq.numel(),), draws.numel()).scatter_reduce_(
        0, inverse, torch.arange(draws.numel()), "amin")
    return draws[first.sort().values[:k]]


class RandomK(Compressor):
    """k elements at indices drawn from (seed, step): only the k values travel.

    Every rank that makes the same sequence of calls with the same seed draws the same indices,
    so payloads can be summed by an allreduce (associative): 2(P−1)α + 2((P−1)/P)kβ.
    Values are not rescaled by n/k; use it with :class:`ErrorFeedback`.
    """

    name = "randomk"
    associative = True
    error_feedback = True
    takes_density = True

    def __init__(self, density: float | None = None, k: int | None = None,
                 seed: int = 0) -> None:
        super().__init__(seed)
        self.density, self.k = _sparse_params(self.name, density, k)
        self._cache: tuple[int, int, torch.Tensor] | None = None
        self._on_device: tuple[tuple[int, int, torch.device], torch.Tensor] | None = None

    @property
    def params(self) -> dict[str, object]:
        return {"k": self.k} if self.k is not None else {"density": self.density}

    def count(self, numel: int) -> int:
        return select_count(numel, self.density, self.k)

    def indices(self, numel: int, step: int) -> torch.Tensor:
        """The indices of call ``step`` for ``numel`` elements (CPU, int64)."""
        if self._cache is None or self._cache[:2] != (numel, step):
            idx = random_indices(numel, self.count(numel), generator(self.seed, step))
            self._cache = (numel, step, idx)
        return self._cache[2]

    def _indices_on(self, numel: int, step: int, device: torch.device) -> torch.Tensor:
        """:meth:`indices` on ``device``: drawn on the CPU (the same stream whatever the
        device), copied from pinned memory without waiting (a pageable copy waits for the
        device's queue, a host sync per call), once for compress and decompress."""
        idx = self.indices(numel, step)
        if device.type == "cpu":
            return idx
        key = (numel, step, device)
        if self._on_device is None or self._on_device[0] != key:
            self._on_device = (key, idx.pin_memory().to(device, non_blocking=True))
        return self._on_device[1]

    def compress(self, x: torch.Tensor) -> SharedIndexPayload:
        x = check_input(self.name, x)
        step = self.step
        self.step += 1
        idx = self._indices_on(x.numel(), step, x.device)
        return SharedIndexPayload(dtype=x.dtype, values=x[idx], step=step)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, SharedIndexPayload)
        idx = self._indices_on(numel, p.step, p.values.device)
        return _sparse_decompress(idx, p.values, numel, p.dtype)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return self.count(numel) * dtype.itemsize

    def summed_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype


class DGC(Compressor):
    """Deep Gradient Compression's sampled threshold (Lin et al. 2018): no exact top-k, so the
    count varies between about k/slack and ⌈slack·k⌉.

    The payload is padded to ⌈slack·k⌉ pairs so every rank sends the same number of bytes;
    ``count`` (int32) says how many are real. Not associative (like topk).
    """

    name = "dgc"
    error_feedback = True
    takes_density = True

    def __init__(self, density: float | None = None, k: int | None = None,
                 sample: float = SAMPLE, passes: int = 3, slack: float = 1.25,
                 seed: int = 0) -> None:
        super().__init__(seed)
        self.density, self.k = _sparse_params(self.name, density, k)
        self.sample = check_fraction(f"{self.name}: sample", sample)
        self.passes = check_int(self.name, "passes", passes, 1)
        if not is_real(slack, 1):
            raise GradwireError(f"dgc: slack must be a finite number >= 1, got {slack!r}")
        self.slack = float(slack)

    @property
    def params(self) -> dict[str, object]:
        size = {"k": self.k} if self.k is not None else {"density": self.density}
        return {**size, "passes": self.passes, "slack": self.slack}

    def capacity(self, numel: int) -> int:
        # round() first, as select_count does: 1.1 * 10 is 11.000000000000002, 11 pairs
        return min(numel, math.ceil(round(self.slack * select_count(numel, self.density,
                                                                    self.k), 6)))

    def compress(self, x: torch.Tensor) -> CountedPayload:
        x = check_input(self.name, x)
        n = x.numel()
        k, cap = select_count(n, self.density, self.k), self.capacity(n)
        idx = dgc_select(x, k, cap, self._generator(x.device), self.sample, self.passes)
        c = idx.numel()
        indices = torch.zeros(cap, dtype=index_dtype(n), device=x.device)
        values = torch.zeros(cap, dtype=x.dtype, device=x.device)
        indices[:c] = idx
        values[:c] = x[idx]
        count = torch.tensor([c], dtype=torch.int32, device=x.device)
        return CountedPayload(dtype=x.dtype, indices=indices, values=values, count=count)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, CountedPayload)
        c = int(p.count[0])
        return _sparse_decompress(p.indices[:c], p.values[:c], numel, p.dtype)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return self.capacity(numel) * (index_dtype(numel).itemsize + dtype.itemsize) + 4
