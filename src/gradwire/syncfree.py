"""Which code path a tensor takes: the host's or the device's.

Aggregation code has two implementations of a few steps (selecting the top k, merging two
selections, summing the entries of every rank, deciding the NaN/Inf policy):

- the **device path**, for CUDA and every other accelerator: fixed shapes (sizes follow from k
  and P, with padding), no host-device synchronisation between a bucket's arrival and its
  future's completion (no ``.item()``, ``bool()``/``int()``/``float()`` of a tensor,
  ``.cpu()``/``.numpy()``/``.tolist()``, ``nonzero``, ``unique`` or masked selection), so the
  host runs ahead of the GPU and the kernels of backward and of communication overlap;
- the **host path**, for CPU tensors: numpy's partition and flatnonzero and data-dependent
  shapes, which are faster there, and on a CPU a "synchronisation" costs nothing.

Both give the same result (the same selected set, bit-identical sums). :func:`device_paths`
runs the device path on CPU tensors too, so that tests without a GPU exercise it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_forced = threading.Event()
_blocks = 0  # device_paths() blocks open, in every thread (under _lock)
_lock = threading.Lock()


def on_host(t: torch.Tensor) -> bool:
    """Whether ``t`` takes the host path: a CPU tensor, unless :func:`device_paths` is on."""
    return t.device.type == "cpu" and not _forced.is_set()


@contextlib.contextmanager
def device_paths() -> Iterator[None]:
    """Within the block, every thread runs the device path on CPU tensors as well. Blocks may
    nest and overlap across threads: the host path returns when the last open block closes."""
    global _blocks
    with _lock:
        _blocks += 1
        _forced.set()
    try:
        yield
    finally:
        with _lock:
            _blocks -= 1
            if _blocks == 0:
                _forced.clear()
