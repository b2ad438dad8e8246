"""The sparse aggregations written out the long way (dicts and numpy scalars, no torch), as
the tests' independent reference for gradwire.sparse.

Same rules as the paper and the package: top-k by |value|, ties to the smaller index; a merge
adds two values once (a + b, in the data's dtype); gTop-k merges along the binomial tree to
rank 0 (at distance d = 1, 2, 4, …, rank v ≡ d mod 2d hands its list to v − d), and what a
merge drops is added to the residual of the rank that merged.
"""
from __future__ import annotations

import numpy as np


def top(entries: dict[int, np.generic], k: int) -> tuple[dict, dict]:
    """(kept, dropped): the k largest |value|, ties to the smaller index."""
    order = sorted(entries, key=lambda i: (-abs(float(entries[i])), i))
    return ({i: entries[i] for i in order[:k]}, {i: entries[i] for i in order[k:]})


def reference(xs: list[np.ndarray], residuals: list[np.ndarray], k: int,
              method: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """(total, residuals after) for every rank's x and residual (numpy arrays, one dtype)."""
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
    d = 1
    while d < p:
        for v in range(d, p, 2 * d):
            mine, theirs = lists[v - d], lists[v]
            merged = dict(mine)
            for i, val in theirs.items():
                merged[i] = merged[i] + val if i in merged else val
            kept, dropped = top(merged, k)
            for i, val in dropped.items():
                acc[v - d][i] = acc[v - d][i] + val
            lists[v - d] = kept
        d *= 2
    total = np.zeros(n, dtype=dtype)
    for i, v in lists[0].items():
        total[i] = v
    return total, acc
