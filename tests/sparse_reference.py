"""The sparse aggregations written out the long way (dicts and numpy scalars, no torch), as
the tests' independent reference for gradwire.sparse.

Same rules as the paper and the package: top-k by |value|, ties to the smaller index; a merge
adds two values once (a + b, in the data's dtype); gTop-k merges along the binomial tree to
rank 0 (at distance d = 1, 2, 4, …, rank v ≡ d mod 2d hands its list to v − d). On the tree
what a merge drops is added to the residual of the rank that merged. On the butterfly ("rd")
each excess rank 1, 3, …, 2e−1 (e = P − 2^⌊lg P⌋) first folds into its left neighbour, which
keeps that merge's drops and answers for its kept sums; the other ranks then merge as the tree
does over their own numbering, and each takes back its own entries that a merge of a group it
belongs to dropped.
"""
from __future__ import annotations

import numpy as np


def top(entries: dict[int, np.generic], k: int) -> tuple[dict, dict]:
    """(kept, dropped): the k largest |value|, ties to the smaller index."""
    order = sorted(entries, key=lambda i: (-abs(float(entries[i])), i))
    return ({i: entries[i] for i in order[:k]}, {i: entries[i] for i in order[k:]})


def merge(a: dict, b: dict, k: int) -> tuple[dict, dict]:
    """a ⊤ b: the union, values added where indices meet, then (kept, dropped)."""
    merged = dict(a)
    for i, val in b.items():
        merged[i] = merged[i] + val if i in merged else val
    return top(merged, k)


def reference(xs: list[np.ndarray], residuals: list[np.ndarray], k: int,
              method: str, algo: str = "tree") -> tuple[np.ndarray, list[np.ndarray]]:
    """(total, residuals after) for every rank's x and residual (numpy arrays, one dtype);
    ``algo``: gTop-k's "tree" or "rd" (the butterfly)."""
    p, n = len(xs), len(xs[0])
    dtype = xs[0].dtype
    acc = [r + x for x, r in zip(xs, residuals, strict=True)]
    lists = []
    for a in acc:
        chosen, _ = top({i: a[i] for i in range(n)}, k)
        lists.append(chosen)
        for i in chosen:
            a[i] = 0
    if method == "topk":
        wide = np.dtype(np.float32 if dtype == np.float16 else dtype).type
        total = np.zeros(n, dtype=wide)
        for chosen in lists:  # rank order, summed in fp32 for fp16 data
            for i, v in chosen.items():
                total[i] = total[i] + wide(v)
        return total.astype(dtype), acc
    if algo == "rd":
        return _butterfly(lists, acc, k, n, dtype)
    d = 1
    while d < p:
        for v in range(d, p, 2 * d):
            kept, dropped = merge(lists[v - d], lists[v], k)
            for i, val in dropped.items():
                acc[v - d][i] = acc[v - d][i] + val
            lists[v - d] = kept
        d *= 2
    return _dense(lists[0], n, dtype), acc


def _butterfly(lists: list[dict], acc: list[np.ndarray], k: int, n: int,
               dtype: np.dtype) -> tuple[np.ndarray, list[np.ndarray]]:
    p = len(lists)
    excess = p - (1 << (p.bit_length() - 1))
    for r in range(1, 2 * excess, 2):  # the fold
        kept, dropped = merge(lists[r - 1], lists[r], k)
        for i, val in dropped.items():
            acc[r - 1][i] = acc[r - 1][i] + val
        lists[r - 1] = kept
    core = [*range(0, 2 * excess, 2), *range(2 * excess, p)]
    own = {r: dict(lists[r]) for r in core}
    alive = {r: set(lists[r]) for r in core}
    d = 1
    while d < len(core):
        for v in range(d, len(core), 2 * d):
            kept, dropped = merge(lists[core[v - d]], lists[core[v]], k)
            lists[core[v - d]] = kept
            for j in range(v - d, min(v + d, len(core))):
                alive[core[j]] -= set(dropped)
        d *= 2
    for r in core:
        for i, val in own[r].items():
            if i not in alive[r]:
                acc[r][i] = acc[r][i] + val
    return _dense(lists[0], n, dtype), acc


def _dense(entries: dict, n: int, dtype: np.dtype) -> np.ndarray:
    total = np.zeros(n, dtype=dtype)
    for i, v in entries.items():
        total[i] = v
    return total
