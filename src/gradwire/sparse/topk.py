"""The ⊤ operator that merges two sparse selections (gTop-k), and the dense average of what
the ranks sent. Selecting the top k of one rank's gradient is :mod:`gradwire.compress.select`,
whose tie rule the merge keeps: among equal |value| the smaller index wins, so ranks, runs and
the reference in the tests agree bit for bit.

On the device path (:mod:`gradwire.syncfree`) :func:`top_merge` takes and gives lists of a
fixed length with padding, and :func:`average_into` writes the dense average: no host sync,
no numpy, the same entries and bits as the host path (NaN payloads aside).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gradwire.check import is_int
from gradwire.compress.select import largest, magnitude_keys
from gradwire.dtypes import acc_dtype
from gradwire.errors import GradwireError
from gradwire.sparse.wire import PAD, Entries, check_entries
from gradwire.syncfree import on_host

_LAST = torch.iinfo(torch.int64).max  # a padding entry's index while sorting: after all others


def in_index_order(e: Entries) -> Entries:
    """``e`` in ascending index order on the host path, where a merge of two ascending lists
    is a linear pass (~3x faster than of two in torch.topk's order at 2 × 25 000 entries);
    ``e`` itself on the device path, whose merge sorts anyway."""
    i = e.indices
    if not on_host(i) or i.numel() < 2 or bool((i[1:] > i[:-1]).all()):
        return e
    order = torch.from_numpy(np.argsort(i.cpu().numpy())).to(i.device)
    return Entries(e.values[order], i[order])


def top_merge(a: Entries, b: Entries, k: int) -> tuple[Entries, Entries]:
    """a ⊤ b (Definition 1 of the gTop-k paper): (kept, dropped).

    The union of both lists, values added where indices meet; kept = the k largest |sum|
    (ties to the smaller index), dropped = the rest. kept + dropped = a + b exactly, element
    by element (each index gets one add of two values, whose result does not depend on order),
    so a caller that keeps ``dropped`` loses no mass. Both come out in ascending index order.

    The union's order comes from numpy's stable sort of the concatenated indices: on two
    ascending lists (what selections and earlier merges are) it is a linear merge of two runs,
    ~3x faster than torch.unique here at 2 × 25 000 entries; values stay in torch (any dtype,
    any device) and are moved with index_select.

    On the device path (:func:`device_merge`): fixed lengths with padding, no host sync.
    """
    kept, dropped, _ = _merge(*_checked("top_merge", a, b, k), False)
    return kept, dropped


def merge_following(a: Entries, b: Entries, k: int) -> tuple[Entries, Entries, torch.Tensor]:
    """:func:`top_merge`, and where each of a's entries went: an int64 tensor of len(a), the
    entry's position in kept, or −1 where the merge dropped it (or it is padding). A caller
    that merges into the same list step after step follows its own entries with it, in O(len)
    per merge, where looking them up in kept would be a search per entry."""
    kept, dropped, where = _merge(*_checked("merge_following", a, b, k), True)
    assert where is not None
    return kept, dropped, where


def _checked(name: str, a: object, b: object, k: object) -> tuple[Entries, Entries, int]:
    """(a, b, k) as a merge takes them, or a one-line GradwireError; metadata only. A negative
    k kept all but |k| of the union on the device path (a slice from the end) and none on the
    host's; int32 indices stopped the device path with a RuntimeError (its padding key does
    not fit them); lists of two dtypes were merged in their promoted dtype."""
    if not is_int(k, 0):
        raise GradwireError(f"{name}: k must be an integer >= 0, got {k!r}")
    a, b = check_entries(name, a), check_entries(name, b)
    if a.values.dtype != b.values.dtype or a.values.device != b.values.device:
        raise GradwireError(f"{name}: both lists must be of one dtype on one device, got "
                            f"{a.values.dtype} on {a.values.device} and {b.values.dtype} on "
                            f"{b.values.device}")
    return a, b, int(k)  # a numpy integer's products wrap


def _merge(a: Entries, b: Entries, k: int,
           follow: bool) -> tuple[Entries, Entries, torch.Tensor | None]:
    if not on_host(a.indices):
        return device_merge(a, b, k, follow=follow)
    dev = a.values.device

    def positions(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(dev)

    idx = np.concatenate([a.indices.cpu().numpy(), b.indices.cpu().numpy()])
    order = np.argsort(idx, kind="stable")
    ordered = idx[order]
    val = torch.cat([a.values, b.values])
    dup = ordered[1:] == ordered[:-1]  # a's entry, then b's entry of the same index
    if dup.any():
        first = np.ones(ordered.size, dtype=bool)
        first[1:] = ~dup
        union, summed = ordered[first], val.index_select(0, positions(order[first]))
        slot = np.cumsum(first) - 1  # a sorted position's entry of the union
        at = np.flatnonzero(dup)
        summed.index_add_(0, positions(slot[at]), val.index_select(0, positions(order[at + 1])))
    else:
        union, summed, slot = ordered, val.index_select(0, positions(order)), None
    keep = largest(summed.abs(), k).cpu().numpy()
    kept, dropped = np.flatnonzero(keep), np.flatnonzero(~keep)
    where = None
    if follow:  # a's entry i: at sorted position mine[i], the union's entry u, kept's entry
        q = np.flatnonzero(order < len(a))
        mine = np.empty(len(a), dtype=np.int64)
        mine[order[q]] = q
        u = mine if slot is None else slot[mine]
        where = positions(np.where(keep[u], np.cumsum(keep)[u] - 1, -1))
    return (Entries(summed.index_select(0, positions(kept)), positions(union[kept])),
            Entries(summed.index_select(0, positions(dropped)), positions(union[dropped])),
            where)


def device_merge(a: Entries, b: Entries, k: int, *,
                 follow: bool = False) -> tuple[Entries, Entries, torch.Tensor | None]:
    """a ⊤ b with no host sync and fixed shapes: (kept, dropped, where), k and
    max(len(a) + len(b), 2k) − k entries (k each for inputs of k), each in ascending index
    order with padding (index ``PAD``, value +0.0) at the end; ``where`` as
    :func:`merge_following`'s with ``follow``, else None.

    Inputs may hold padding anywhere; their real indices are distinct within a list, in any
    order. The real entries are the host's :func:`top_merge`'s, bit for bit (a NaN's payload
    aside): the union, a's value + b's value where indices meet (one correctly rounded add, as
    the host's index_add_), kept = the k largest |sum| under the tie rule (NaN above
    everything, where the host ranks NaN level with ±inf: :mod:`gradwire.compress.select`).

    One stable sort of the concatenated indices (a's entry before b's of the same index), the
    sums, one stable sort of the sums' magnitude keys (ties stay in index order), then a sort
    of each half's positions: O(k log k) on the device.
    """
    idx = torch.cat([a.indices, b.indices])
    val = torch.cat([a.values, b.values])
    width = max(idx.numel(), 2 * k)
    if width == 0:
        return Entries(val, idx), Entries(val, idx), idx.new_empty(0) if follow else None
    if width > idx.numel():  # so that kept and dropped both come out k long
        more = width - idx.numel()
        idx = torch.cat([idx, idx.new_full((more,), PAD)])
        val = torch.cat([val, val.new_zeros(more)])
    ordered, order = torch.sort(torch.where(idx >= 0, idx, _LAST), stable=True)
    v = val[order]
    repeat = ordered[1:] == ordered[:-1]  # position i + 1 holds b's entry of i's index
    live = ordered != _LAST  # a real entry of the union: the first of its index
    live[1:] &= ~repeat
    joined = torch.cat([repeat, repeat.new_zeros(1)])  # position i has b's entry at i + 1
    summed = torch.where(joined, v + v.roll(-1), v)
    keys = torch.where(live, magnitude_keys(summed).long(), -1)
    by_size = torch.sort(keys, descending=True, stable=True).indices

    def ascending(pos: torch.Tensor) -> tuple[Entries, torch.Tensor]:
        """The entries at sorted positions ``pos``, ascending, padding last; and the sorted
        position each came from (a padding entry: some position that is not live)."""
        at = torch.sort(torch.where(live[pos], pos, pos + width)).values  # padding last
        real = at < width
        at = torch.where(real, at, at - width)
        return Entries(torch.where(real, summed[at], 0), torch.where(real, ordered[at], PAD)), at

    (kept, came), (dropped, _) = ascending(by_size[:k]), ascending(by_size[k:])
    where = None
    if follow:  # a's entry i sits at sorted position inv[i]: live unless it is padding
        inv = torch.empty_like(order).scatter_(0, order, torch.arange(width, device=order.device))
        in_kept = torch.full_like(order, -1).scatter_(0, came, torch.arange(k, device=order.device))
        mine = inv[: len(a)]
        where = torch.where(live[mine], in_kept[mine], -1)
    return kept, dropped, where


def _put(out: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    """``out[indices] = values`` for the real entries (index ≥ 0), no host sync. A padding
    entry repeats the write of the real entry of largest index (the same value to the same
    place), or writes 0 at index 0 when there is none (``out`` is zero there)."""
    if indices.numel() == 0:
        return
    real = indices >= 0
    top, a = indices.max(0)  # the largest index, real if any is: padding is −1
    has = top >= 0
    anchor = values.index_select(0, a.reshape(1))  # no 0-d tensor index: that may sync
    out.index_put_((torch.where(real, indices, torch.where(has, top, 0)),),
                   torch.where(real, values, torch.where(has, anchor, 0)))


def mean(sums: torch.Tensor, dtype: torch.dtype, world_size: int, scale: int = 1,
         divided: torch.Tensor | None = None) -> torch.Tensor:
    """``sums`` (:func:`gradwire.dtypes.acc_dtype`) · ``scale`` / ``world_size`` in ``dtype``:
    the sum cast to ``dtype``, then divided, except where that cast overflows a finite sum
    (two fp16 ranks sending 60 000): there the division comes first, as a dense allreduce's
    does, so a mean that ``dtype`` holds is not turned into inf. No host sync.

    ``scale``: gTop-k's :func:`wire_scale`, by which its sums travel divided (their sum · scale
    may pass acc_dtype's largest value, fp32's for fp32 or bf16; ``sums`` / world_size ·
    scale does not where the mean fits). ``divided``: Top-k's, whose ``sums`` are whole: the
    same sums made of the values divided by :func:`wire_scale` (:func:`rank_sums`), taken
    only where ``sums`` overflowed acc_dtype (two fp32 ranks sending 3e38), so that every
    finite sum is used as it is."""
    if divided is None:
        if sums.dtype == dtype and scale == 1:  # fp32, fp64 on one rank: nothing to overflow
            return sums / world_size
        whole, small = (sums if scale == 1 else sums * scale), sums
    else:
        whole, small, scale = sums, divided, wire_scale(dtype, world_size)
    cast = whole.to(dtype)
    first = whole / world_size
    if scale != 1:
        # small / P · scale: one rounding, the power of two exact below the largest value
        first = torch.where(whole.isinf(), small / world_size * scale, first)
    return torch.where(cast.isinf() & small.isfinite(), first.to(dtype), cast / world_size)


def wire_scale(dtype: torch.dtype, world_size: int) -> int:
    """What a sum of ``world_size`` ranks' values of ``dtype`` is made of values divided by,
    so that no partial sum overflows where the average fits: 2^⌈lg P⌉ (1 for one rank).
    gTop-k divides every rank's values by it before they go on the wire, Top-k adds up its
    values divided by it beside the whole ones (:func:`rank_sums`).

    A merge adds in the wire's dtype, so unscaled a partial sum of in-range values overflows
    (four fp16 ranks' 30 000 reach 120 000, two fp32 ranks' 3e38 reach 6e38) where their
    average does not; scaled, no partial sum of m ≤ P ranks' values exceeds the largest of
    them (PyTorch's fp16 hook divides by P before its allreduce for the same reason). A power
    of two keeps every add's rounding that of the unscaled sum, and the scaling exact above
    the dtype's smallest normal times 2^⌈lg P⌉ (fp16's 2⁻¹⁴, fp32's 2⁻¹²⁶); below, gTop-k
    gives what it rounds away back to the sender's residual, and Top-k's divided sums count
    only where its whole ones overflow."""
    if world_size < 2:
        return 1
    return 1 << (world_size - 1).bit_length()


def rank_sums(lists: Sequence[Entries], slot: torch.Tensor, size: int, world_size: int
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k's sums: the values of ``lists`` (the P ranks' lists in rank order, indices
    distinct within a list) added up rank by rank in :func:`gradwire.dtypes.acc_dtype` into
    ``size`` slots, ``slot`` giving each entry's (list after list). And, where P values of the
    lists' dtype can pass acc_dtype's largest value (bf16, fp32, fp64), the same sums of the
    values divided by :func:`wire_scale`, which stay finite where the average fits
    (:func:`mean`'s ``divided``); None otherwise (fp16, or one rank). No host sync."""
    dtype = lists[0].values.dtype
    sums = torch.zeros(size, dtype=acc_dtype(dtype), device=slot.device)
    scale = wire_scale(dtype, world_size)
    divided = None
    if scale > 1 and torch.finfo(dtype).max * world_size > torch.finfo(sums.dtype).max:
        divided = torch.zeros_like(sums)
    start = 0
    for e in lists:  # rank by rank (a list's indices are distinct): a fixed order
        at, values = slot[start : start + len(e)], e.values.to(sums.dtype)
        sums.index_add_(0, at, values)
        if divided is not None:
            divided.index_add_(0, at, values / scale)
        start += len(e)
    return sums, divided


def average_into(lists: Sequence[Entries], numel: int, world_size: int, out: torch.Tensor,
                 *, summed: bool = False, scale: int = 1) -> torch.Tensor:
    """The dense average of what the ranks sent, in ``out`` (overwritten; returned), with no
    host sync: bit for bit the host's ``finish()`` then ``SparseResult.average(out)`` of
    :mod:`gradwire.sparse.allreduce`.

    ``lists``: TopKAllReduce's P lists, in rank order (padding allowed; indices distinct within
    a list). At every index any rank sent: (Σ over ranks, rank by rank, in
    :func:`gradwire.dtypes.acc_dtype`, then cast to the lists' dtype) / ``world_size``
    (:func:`mean`); 0 elsewhere. ``summed=True``: ``lists`` is gTopKAllReduce's one list,
    already the sum, divided by ``scale`` (:func:`wire_scale`): values / ``world_size`` at its
    indices (no round trip through the sum's dtype, which would turn −0.0 into +0.0), or with
    a ``scale``, :func:`mean` of the values in acc_dtype. ``out``: 1-D, ``numel`` elements of
    the lists' dtype; it may share memory with the lists' values, which are read before it is
    zeroed.

    The union comes from one sort of the P·k indices (no torch.unique, whose size depends on
    the data); the sums live in P·k slots, not in a dense scratch: O(P·k log P·k) on the
    device plus the one pass that zeroes ``out``.
    """
    if not lists:
        raise GradwireError("average_into: no lists")
    dtype = lists[0].values.dtype
    if out.shape != (numel,) or out.dtype != dtype:
        raise GradwireError(f"out must be a 1-D tensor of {numel} {dtype}, got "
                            f"{tuple(out.shape)} {out.dtype}")
    if summed:
        if len(lists) != 1:
            raise GradwireError(f"average_into: summed=True takes one list, got {len(lists)}")
        values = lists[0].values
        average = (values / world_size if scale == 1 else
                   mean(values.to(acc_dtype(dtype)), dtype, world_size, scale))
        _put(out.zero_(), lists[0].indices, average)
        return out
    idx = torch.cat([e.indices for e in lists])
    ordered, order = torch.sort(torch.where(idx >= 0, idx, _LAST))
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]
    slot_of_sorted = first.cumsum(0) - 1
    slot = torch.empty_like(slot_of_sorted).scatter_(0, order, slot_of_sorted)
    sums, divided = rank_sums(lists, slot, idx.numel(), world_size)
    average = mean(sums, dtype, world_size, divided=divided)
    out.zero_()
    _put(out, torch.where(ordered != _LAST, ordered, PAD), average[slot_of_sorted])
    return out
