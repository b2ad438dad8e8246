"""The ⊤ operator that merges two sparse selections (gTop-k). Selecting the top k of one
rank's gradient is :mod:`gradwire.compress.select`, whose tie rule the merge keeps: among equal
|value| the smaller index wins, so ranks, runs and the reference in the tests agree bit for
bit."""

from __future__ import annotations

import numpy as np
import torch

from gradwire.compress.select import largest
from gradwire.sparse.wire import Entries


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
    """
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
        at = np.flatnonzero(dup)
        summed.index_add_(0, positions(np.cumsum(first)[at] - 1),
                          val.index_select(0, positions(order[at + 1])))
    else:
        union, summed = ordered, val.index_select(0, positions(order))
    keep = largest(summed.abs(), k).cpu().numpy()
    kept, dropped = np.flatnonzero(keep), np.flatnonzero(~keep)
    return (Entries(summed.index_select(0, positions(kept)), positions(union[kept])),
            Entries(summed.index_select(0, positions(dropped)), positions(union[dropped])))
