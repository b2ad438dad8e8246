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

from gradwire.check import is_int
from gradwire.dtypes import FLOATS, index_dtype
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


def check_entries(name: str, e: object) -> Entries:
    """``e`` as the :class:`Entries` a call of ``name`` takes: 1-D float values (fp16, bf16,
    fp32, fp64) and as many integer indices on their device, the indices as int64 (the same
    tensor when they are). Metadata only: no pass over the data, no host read. Anything else
    is a one-line GradwireError, where it was a RuntimeError or IndexError deep inside, or
    (float or int32 indices, integer values) a list packed or merged wrong without one."""
    if not isinstance(e, Entries):
        raise GradwireError(f"{name}: expected Entries (values, indices), got "
                            f"{type(e).__name__}")
    v, i = e.values, e.indices
    if not (isinstance(v, torch.Tensor) and v.dim() == 1 and v.dtype in FLOATS):
        got = f"{tuple(v.shape)} {v.dtype}" if isinstance(v, torch.Tensor) else type(v).__name__
        raise GradwireError(f"{name}: values must be a 1-D float tensor (fp16, bf16, fp32, "
                            f"fp64), got {got}")
    if not (isinstance(i, torch.Tensor) and i.shape == v.shape and i.device == v.device
            and not i.dtype.is_floating_point and not i.dtype.is_complex
            and i.dtype != torch.bool):
        got = (f"{tuple(i.shape)} {i.dtype} on {i.device}" if isinstance(i, torch.Tensor)
               else type(i).__name__)
        raise GradwireError(f"{name}: indices must be an integer tensor of the values' "
                            f"{tuple(v.shape)} entries on {v.device}, got {got}")
    return e if i.dtype == torch.int64 else Entries(v, i.long())


def _check_sizes(name: str, k: object, numel: object) -> tuple[int, int]:
    """(k, numel) as Python ints (a numpy integer's products wrap), each an integer >= 0."""
    for what, n in (("k", k), ("numel", numel)):
        if not is_int(n, 0):
            raise GradwireError(f"{name}: {what} must be an integer >= 0, got {n!r}")
    return int(k), int(numel)  # type: ignore[call-overload]


def entry_bytes(numel: int, dtype: torch.dtype) -> int:
    """Bytes of one (value, index) pair for a gradient of ``numel`` elements of ``dtype``."""
    return dtype.itemsize + index_dtype(numel).itemsize


def pack(e: Entries, k: int, numel: int) -> torch.Tensor:
    """``e`` as k packed entries (padded): a new ``uint8`` tensor of k·entry_bytes bytes.
    ``e`` may hold padding entries of its own (at most k entries in all); no host sync."""
    e = check_entries("pack", e)
    k, numel = _check_sizes("pack", k, numel)
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
    k, numel = _check_sizes("unpack", k, numel)
    if dtype not in FLOATS:
        raise GradwireError(f"unpack: dtype must be one of fp16, bf16, fp32, fp64, got "
                            f"{dtype!r}")
    if not (isinstance(buf, torch.Tensor) and buf.dim() == 1 and buf.dtype == torch.uint8):
        # the size below counts elements: another dtype's would be read as garbage
        got = (f"{tuple(buf.shape)} {buf.dtype}" if isinstance(buf, torch.Tensor)
               else type(buf).__name__)
        raise GradwireError(f"unpack: expected a 1-D uint8 tensor (what pack returns), got "
                            f"{got}")
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
