"""Every rank of a sparse aggregation in one process: the same plans, no network.

For property tests over many world sizes and for what-if runs. Each rank's part is the plan
:func:`gradwire.sparse.sparse_allreduce` would run; :func:`execute_local` plays the schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.sparse.allreduce import SparseResult, check_args, feed, plan, shares_memory


def simulate(xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor], k: int,
             method: str = "gtopk", *, selector: str = "exact",
             algo: str | None = None) -> list[SparseResult]:
    """What ``sparse_allreduce(xs[r], residuals[r], k, method)`` does on each rank r of
    len(xs) ranks, without its NaN/Inf policy: every rank sends its status as OK, so NaN or
    Inf in x, or x + residual overflowing x's dtype, is selected and applied (or kept in the
    residual) as it is, where sparse_allreduce would aggregate dense. Residuals are updated
    in place; one result per rank."""
    if len(xs) == 0 or len(xs) != len(residuals):  # len: xs may be a tensor of rows
        raise GradwireError(f"simulate needs one x and one residual per rank, got {len(xs)} "
                            f"and {len(residuals)}")
    p = len(xs)
    for r, (x, res) in enumerate(zip(xs, residuals, strict=True)):
        check_args(x, res, k, method, selector, algo)
        if x.numel() != xs[0].numel() or x.dtype != xs[0].dtype:
            raise GradwireError(f"rank {r}: x is {x.numel()} {x.dtype}, rank 0's is "
                                f"{xs[0].numel()} {xs[0].dtype}")
    for r, res in enumerate(residuals):
        # each rank's residual is written in place: one shared by two ranks would take both
        # ranks' error feedback, silently ([torch.zeros(n)] * p), as would another's x
        if res.numel() and any(q.numel() and shares_memory(res, q)
                               for q in [*residuals[:r], *xs]):
            raise GradwireError(f"simulate: rank {r}'s residual shares memory with another "
                                f"rank's x or residual; each rank needs a residual of its own")
    k, n, plans = int(k), xs[0].numel(), []  # k: a numpy integer's products wrap
    for r, (x, res) in enumerate(zip(xs, residuals, strict=True)):
        e = feed(x.detach(), res.detach(), k, selector)  # data, as in sparse_allreduce
        plans.append(plan(method, e, min(k, n), n, res.detach(), r, p, algo))
    execute_local(plans[0].schedule, [q.buffer for q in plans], [q.combine for q in plans])
    return [q.finish() for q in plans]
