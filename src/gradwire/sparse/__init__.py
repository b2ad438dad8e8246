"""Sparse aggregation of per-rank top-k selections: TopKAllReduce and gTopKAllReduce
(Shi et al. 2019, "A Distributed Synchronous SGD Algorithm with Global Top-k Sparsification",
Algorithms 1, 3 and 4; Table I).

Every rank sends k (value, index) entries packed in one byte buffer (:mod:`.wire`: values in
the gradient's dtype, then int32 indices; fp32 → 8 bytes per entry). Neither method has an
algorithm of its own: each runs a registered schedule over that buffer.

| method      | schedule                                   | bytes sent (fp32) | cost             |
|-------------|--------------------------------------------|-------------------|------------------|
| topk        | allgather of P·k entries: "rd" (P a power  | 8k(P−1) each rank | ⌈lgP⌉·α+2(P−1)kβ |
|             | of two) or "bruck"                         |                   |                  |
| gtopk       | "rd" allreduce (butterfly), op ⊤           | 8k per step       | lgP·α+2k·lgP·β   |
| gtopk, tree | the paper's binomial tree, op ⊤            | 8k per edge, ×2   | 2lgP·α+4k·lgP·β  |

β per element; an entry is 2 elements (value and index); each list also carries its sender's
status byte (:mod:`.wire`). The last row is Table I's. For P a power of two the butterfly makes
the tree's merges and ends with the same k entries, in half the steps and half the bytes; for
other P it folds the extra ranks in (⌈lg P⌉ + 1 steps, fewer than the tree's 2⌈lg P⌉ each
way). :func:`estimate` gives these numbers from the schedule, for any P; the transport's byte
counters equal ``traffic(schedule(...), 1)`` exactly (tests/scripts/sparse_check.py).

What each rank ends with, :func:`sparse_allreduce` (error feedback included):

1. acc = residual + x; select the k largest |acc| (ties to the smaller index,
   ``selector="exact"``); residual = acc − sent, in place.
2. topk: gather every rank's entries; total = their sum. Everything sent is applied.
   gtopk: merges a ⊤ b (union, values added on equal indices, keep the k largest |value|,
   ties to the smaller index) along the butterfly, or on the paper's tree a binomial reduce to
   rank 0 then a binomial broadcast, so every rank holds the same k entries (the global top-k
   and its mask, Algorithm 3). Values travel divided by 2^⌈lg P⌉
   (:func:`~gradwire.sparse.topk.wire_scale`), so that no merge overflows where the average
   fits; the wire's bytes are the same. Top-k's sums, made on each rank, fall back to the
   values so divided where a sum overflows, so the average that fits comes out finite there
   too (its total, Σ, is then ±inf: it does not fit).
3. What a merge drops goes back to residuals. On the butterfly every rank sees each merge on
   its path and takes back its own selected values that a merge dropped: the paper's
   per-worker residual (Algorithm 4, line 10: ε += own selection outside the final mask),
   made lossless. The paper returns only values whose index is not in the final mask, so a
   value dropped at an inner level whose index still reaches the final set through another
   subtree is neither applied nor kept (the reference code's mass loss); here it goes back.
   On the tree a leaf does not see the merges above it, so each merge's drops (a partial sum
   of its subtree) go to the rank that merged. Either way, summed over ranks and exactly for
   representable sums:

       Σ residual_after + P·average = Σ (residual_before + x)

   The tree's way concentrates the dropped mass of a whole subtree in one residual, which
   trains worse (docs/compression.md). A rank that folds into its left
   neighbour on the butterfly (P not a power of two) hands it its entries, and with them its
   drops. Entries that cancel across ranks (sum 0, never selected) can stay in their
   residuals, summing to zero. Works for any P ≥ 1 (the reference code needs a power of two).
4. The return value is total / P, dense, x's dtype, identical on every rank.

Example::

    residual = torch.zeros_like(grad)                      # kept across iterations
    avg = sparse_allreduce(grad, residual, k=grad.numel() // 1000, method="gtopk")
    # avg: the average over ranks of what was applied; residual: what this rank still owes

:func:`gradwire.sparse.local.simulate` runs all ranks in one process (tests, what-if runs).
"""

from gradwire.compress.select import SELECTORS, select
from gradwire.sparse.allreduce import (
    METHODS,
    Plan,
    SparseResult,
    estimate,
    gtopk_allreduce,
    schedule,
    sparse_allreduce,
    topk_allreduce,
)
from gradwire.sparse.topk import top_merge
from gradwire.sparse.wire import Entries, entry_bytes, pack, unpack

__all__ = ["METHODS", "SELECTORS", "Entries", "Plan", "SparseResult", "entry_bytes", "estimate",
           "gtopk_allreduce", "pack", "schedule", "select", "sparse_allreduce", "top_merge",
           "topk_allreduce", "unpack"]
