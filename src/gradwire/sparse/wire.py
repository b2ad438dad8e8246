"""The wire format of a sparse selection: one packed ``uint8`` buffer per list of k entries.

Layout: k values in the gradient's dtype, then k indices, int32 while numel < 2³¹ (int64
beyond). Nothing is promoted: fp32 entries are 8 bytes, fp16 6, fp64 12 (the gTop-k reference
code concatenated int64 indices with fp32 values and sent 16). A list with fewer than k entries
is padded with (value 0, index −1); −1 is all 0xFF bytes in two's complement, so padding is one
fill. In memory, :class:`Entries` hold int64 indices (what torch indexing wants).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradwire.dtypes import index_dtype
from gradwire.errors import GradwireError

PAD = -1  # the index of a padding entry


@dataclass(frozen=True)
class Entries:
    """A sparse vector: ``values[i]`` belongs at ``indices[i]`` (int64, distinct, no padding)."""

    values: torch.Tensor
    indices: torch.Tensor

    def __len__(self) -> int:
        return self.indices.numel()


def entry_bytes(numel: int, dtype: torch.dtype) -> int:
    """Bytes of one (value, index) pair for a gradient of ``numel`` elements of ``dtype``."""
    return dtype.itemsize + index_dtype(numel).itemsize


def pack(e: Entries, k: int, numel: int) -> torch.Tensor:
    """``e`` as k packed entries (padded): a new ``uint8`` tensor of k·entry_bytes bytes."""
    c, dtype = len(e), e.values.dtype
    if c > k:
        raise GradwireError(f"cannot pack {c} entries into a list of {k}")
    nv = k * dtype.itemsize
    buf = torch.empty(k * entry_bytes(numel, dtype), dtype=torch.uint8, device=e.values.device)
    used = c * dtype.itemsize
    buf[:used].copy_(e.values.contiguous().view(torch.uint8))
    buf[used:nv].zero_()
    idx = e.indices.to(index_dtype(numel)).contiguous().view(torch.uint8)
    buf[nv : nv + idx.numel()].copy_(idx)
    buf[nv + idx.numel() :].fill_(0xFF)
    return buf


def unpack(buf: torch.Tensor, k: int, numel: int, dtype: torch.dtype) -> Entries:
    """The real (non-padding) entries of a packed list of k."""
    nv = k * dtype.itemsize
    if buf.numel() != k * entry_bytes(numel, dtype):
        raise GradwireError(f"packed list has {buf.numel()} bytes, expected {k} entries of "
                            f"{entry_bytes(numel, dtype)} bytes")
    # clone(): a view at an odd offset of the buffer may be misaligned for the wider dtype.
    values = buf[:nv].clone().view(dtype)
    indices = buf[nv:].clone().view(index_dtype(numel)).long()
    real = indices != PAD
    if not bool(real.all()):
        values, indices = values[real], indices[real]
    return Entries(values, indices)
