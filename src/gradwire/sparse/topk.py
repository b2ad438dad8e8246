"""Selecting the k largest |x| on one rank, and the ⊤ operator that merges two selections.

Ties are broken towards the smaller index wherever the choice is ours (the exact selector and
every merge), so ranks, runs and the reference in the tests agree bit for bit. A NaN counts as
larger than any number (as in torch.topk): it is selected and sent, and shows up in the result
as it would in a dense allreduce, instead of silently stopping the selection.
"""

from __future__ import annotations

import torch

from gradwire.compress.base import generator
from gradwire.compress.sparse import threshold_topk
from gradwire.sparse.wire import Entries

SELECTORS = ("exact", "threshold")
TIE_CHUNK = 2**20


def largest(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the k largest of ``mag`` (≥ 0 or NaN), ties to the smaller index.

    One torch.topk for the k-th largest value t, then everything above t and the first tied
    elements equal to t; two compares and a nonzero over ``mag``, no sort.
    """
    n = mag.numel()
    keep = torch.zeros(n, dtype=torch.bool, device=mag.device)
    if k >= n:
        return keep.fill_(True)
    if k <= 0:
        return keep
    t = torch.topk(mag, k, sorted=False).values.min()
    if bool(torch.isnan(t)):  # NaN ranks above +inf, as in torch.topk
        mag = torch.nan_to_num(mag, nan=float("inf"), posinf=float("inf"))
        t = torch.topk(mag, k, sorted=False).values.min()
    torch.gt(mag, t, out=keep)
    need = k - int(keep.sum())
    # The first ``need`` ties, found a chunk at a time: when t is 0 in a mostly-zero gradient
    # nearly every element ties, and one nonzero over all of them would list them all.
    for start in range(0, n, TIE_CHUNK):
        if need <= 0:
            break
        tied = torch.nonzero(mag[start : start + TIE_CHUNK] == t).squeeze(1)[:need]
        keep[tied + start] = True
        need -= tied.numel()
    return keep


def select(acc: torch.Tensor, k: int, selector: str = "exact") -> torch.Tensor:
    """Indices (int64) of the min(k, n) largest |acc|.

    ``exact``: :func:`largest`, deterministic ties. ``threshold``: the sampled-threshold
    selector of :mod:`gradwire.compress.sparse` (about one pass over acc instead of a
    torch.topk over all of it; the same set except which of several tied elements is taken).
    """
    n = acc.numel()
    k = min(k, n)
    if k == n:
        return torch.arange(n, device=acc.device)
    if selector == "threshold":
        return threshold_topk(acc, k, generator(0, 0, acc.device))
    return torch.nonzero(largest(acc.abs(), k)).squeeze(1)


def top_merge(a: Entries, b: Entries, k: int) -> tuple[Entries, Entries]:
    """a ⊤ b (Definition 1 of the gTop-k paper): (kept, dropped).

    The union of both lists, values added where indices meet; kept = the k largest |sum|
    (ties to the smaller index), dropped = the rest. kept + dropped = a + b exactly, element
    by element (each index gets one add of two values, whose result does not depend on order),
    so a caller that keeps ``dropped`` loses no mass. Both come out in ascending index order.
    """
    idx = torch.cat([a.indices, b.indices])
    val = torch.cat([a.values, b.values])
    uniq, where = torch.unique(idx, sorted=True, return_inverse=True)
    summed = torch.zeros(uniq.numel(), dtype=val.dtype, device=val.device)
    summed.index_add_(0, where, val)
    keep = largest(summed.abs(), k)
    kept, dropped = torch.nonzero(keep).squeeze(1), torch.nonzero(~keep).squeeze(1)
    return Entries(summed[kept], uniq[kept]), Entries(summed[dropped], uniq[dropped])
