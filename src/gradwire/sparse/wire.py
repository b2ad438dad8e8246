"""The wire format of a sparse selection: one packed ``uint8`` buffer per list of k entries.

Layout: k values in the gradient's dtype, then k indices, int32 while numel < 2³¹ (int64
beyond). Nothing is promoted: fp32 entries are 8 bytes, fp16 6, fp64 12 (the gTop-k reference
code concatenated int64 indices with fp32 values and sent 16). A list with fewer than k entries
is padded with (value 0, index −1); −1 is all 0xFF bytes in two's complement, so padding is one
fill. In memory, :class:`Entries` hold int64 indices (what torch indexing wants).

A message of :mod:`gradwire.sparse.allreduce` is one such list followed by ``STATUS_BYTES``
byte: the sender's NaN/Inf status (:mod:`gradwire.compress.feedback`), merged by max.

On the host path (:mod:`gradwire.syncfree`) :func:`unpack` drops the padding; on the device
path it keeps it (dropping it would make the size depend on the data, a host sync), and
:func:`pack`, :func:`add_into` and the device functions of :mod:`gradwire.sparse.topk` take
padded lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradwire.dtypes import index_dtype
from gradwire.errors import GradwireError
from gradwire.syncfree import on_host

PAD = -1  # the index of a padding entry
STATUS_BYTES = 1  # after a message's packed list: the sender's status byte


@dataclass(frozen=True)
class Entries:
    """A sparse vector: ``values[i]`` belongs at ``indices[i]`` (int64, distinct). On the host
    path no padding; on the device path possibly padding entries (index ``PAD``, value 0),
    which mean nothing. ``len`` counts them."""

    values: torch.Tensor
    indices: torch.Tensor

    def __len__(self) -> int:
        return self.indices.numel()


def entry_bytes(numel: int, dtype: torch.dtype) -> int:
    """Bytes of one (value, index) pair for a gradient of ``numel`` elements of ``dtype``."""
    return dtype.itemsize + index_dtype(numel).itemsize


def pack(e: Entries, k: int, numel: int) -> torch.Tensor:
    """``e`` as k packed entries (padded): a new ``uint8`` tensor of k·entry_bytes bytes.
    ``e`` may hold padding entries of its own (at most k entries in all); no host sync."""
    c, dtype = len(e), e.values.dtype
    if c > k:
        raise GradwireError(f"cannot pack {c} entries into a list of {k}")
    nv = k * dtype.itemsize
    buf = torch.empty(k * entry_bytes(numel, dtype), dtype=torch.uint8, device=e.values.device)
    used, ends = c * dtype.itemsize, nv + c * index_dtype(numel).itemsize
    if c:  # an empty tensor may have stride 0, which no byte view takes
        buf[:used].copy_(e.values.contiguous().view(torch.uint8))
        buf[nv:ends].copy_(e.indices.to(index_dtype(numel)).contiguous().view(torch.uint8))
    buf[used:nv].zero_()
    buf[ends:].fill_(0xFF)
    return buf


def unpack(buf: torch.Tensor, k: int, numel: int, dtype: torch.dtype) -> Entries:
    """The real (non-padding) entries of a packed list of k; on the device path all k, padding
    included (no host sync, a fixed size)."""
    nv = k * dtype.itemsize
    if buf.numel() != k * entry_bytes(numel, dtype):
        raise GradwireError(f"packed list has {buf.numel()} bytes, expected {k} entries of "
                            f"{entry_bytes(numel, dtype)} bytes")
    # clone(): a view at an odd offset of the buffer may be misaligned for the wider dtype.
    values = buf[:nv].clone().view(dtype)
    indices = buf[nv:].clone().view(index_dtype(numel)).long()
    if not on_host(buf):
        return Entries(values, indices)
    real = indices != PAD
    if not bool(real.all()):
        values, indices = values[real], indices[real]
    return Entries(values, indices)


def add_into(dense: torch.Tensor, e: Entries) -> torch.Tensor:
    """``dense[e.indices] += e.values`` in place, padding entries (index < 0) adding nothing;
    no host sync. Returns ``dense``.

    Each real entry is one add, exactly as ``dense.index_add_`` of the real entries alone
    (within ``e`` indices are distinct). A padding entry adds −0.0 at index 0: x + (−0.0) is x
    for every x, −0.0 and NaN included, where +0.0 would turn a −0.0 into +0.0."""
    real = e.indices >= 0
    return dense.index_add_(0, torch.where(real, e.indices, 0),
                            torch.where(real, e.values, -0.0))
