"""Spare buffers, kept for the next receive and the next call instead of handed back to the
allocator: memory it returns to the kernel comes back as fresh pages, and each page's first
touch is a fault (measurements where each pool is made: ``executor.STAGING``, the executor's
staging buffers; ``api.WORK_BUFFERS``, reduce-scatter's work buffers).

Example::

    pool = BufferPool(keep=256 * 2**20)
    with pool.lend(count, like=buffer) as tmp:   # back in the pool if the block ends well
        ...

A buffer that may still be the target of a posted receive is never given back: a peer's late
send would land in whatever the next call keeps there. So a call that fails drops the buffers
it was receiving into (a PeerError leaves the receive posted) instead of giving them back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class BufferPool:
    """Spare 1-D buffers by (dtype, device, elements), at most ``keep`` bytes in all; shared by
    calls running at once (async_op), each of which takes a buffer of its own."""

    def __init__(self, keep: int) -> None:
        self.keep = keep  # tuned by the user: 0 hands every buffer back to the allocator
        self._free: dict[tuple[torch.dtype, torch.device, int], list[torch.Tensor]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """Bytes of the spares the pool holds now."""
        return self._bytes

    def take(self, count: int, like: torch.Tensor) -> torch.Tensor:
        """A buffer of ``count`` elements of ``like``'s dtype and device: a spare if one is
        free, else a new one. Its contents are whatever was there. A new one is a normal tensor
        even in inference mode: a later call outside it writes into the buffer in place."""
        with self._lock:
            spares = self._free.get((like.dtype, like.device, count))
            if spares:
                tmp = spares.pop()
                self._bytes -= tmp.numel() * tmp.element_size()
                return tmp
        with torch.inference_mode(False):
            return torch.empty(count, dtype=like.dtype, device=like.device)

    def give(self, tmp: torch.Tensor) -> None:
        """Keep ``tmp`` for a later ``take``; the caller keeps no reference to it."""
        nbytes = tmp.numel() * tmp.element_size()
        with self._lock:
            if self._bytes + nbytes > self.keep:  # sizes changed: keep the newest
                self._free.clear()
                self._bytes = 0
            if nbytes <= self.keep:
                self._free.setdefault((tmp.dtype, tmp.device, tmp.numel()), []).append(tmp)
                self._bytes += nbytes

    @contextmanager
    def lend(self, count: int, like: torch.Tensor) -> Iterator[torch.Tensor]:
        """``take`` for the ``with`` block; given back when it ends, dropped when it raises
        (receives posted into it may still be pending: see the module's notes)."""
        tmp = self.take(count, like)
        yield tmp
        self.give(tmp)

