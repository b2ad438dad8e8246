"""Numbers, not tokens: every registered algorithm, run for all ranks in one process, leaves
exactly the reference result (integer-valued float64, so sums are exact in any order). The
symbolic checker (test_schedules.py) proves where data goes; this holds the arithmetic of the
combine path and each collective's meaning (which block a rank owns, where the root is)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.collectives.local import execute_local
from gradwire.schedules import registry
from gradwire.schedules.ir import blocks

ALGOS = [pytest.param(a, id=f"{a.collective}/{a.name}") for a in registry.ALGORITHMS]


def _inputs(p: int, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-9, 10, (n,), generator=g).double() for _ in range(p)]


@pytest.mark.parametrize("algo", ALGOS)
@given(p=st.integers(1, 9), n=st.integers(0, 70), root=st.integers(0, 8),
       seed=st.integers(0, 2**16))
@settings(max_examples=15, deadline=None)
def test_every_algorithm_equals_the_reference(algo, p, n, root, seed):
    root = root % p if algo.rooted else 0
    s = registry.schedule(algo.collective, algo.name, p, n, root)
    given_ = _inputs(p, n, seed)
    bufs = [b.clone() for b in given_]
    total = torch.stack(given_).sum(0)
    c = algo.collective
    if c == "allgather":  # rank r contributes its own block
        want = torch.zeros(n, dtype=torch.float64)
        for r, (b0, bn) in enumerate(blocks(n, p)):
            want[b0 : b0 + bn] = given_[r][b0 : b0 + bn]
        for r, (b0, bn) in enumerate(blocks(n, p)):
            bufs[r].zero_()
            bufs[r][b0 : b0 + bn] = given_[r][b0 : b0 + bn]
    execute_local(s, bufs)
    for r in range(p):
        if c == "allreduce":
            assert torch.equal(bufs[r], total), r
        elif c == "reduce" and r == root:
            assert torch.equal(bufs[r], total)
        elif c == "broadcast":
            assert torch.equal(bufs[r], given_[root]), r
        elif c == "allgather":
            assert torch.equal(bufs[r], want), r
        elif c == "reducescatter":
            b0, bn = blocks(n, p)[r]
            assert torch.equal(bufs[r][b0 : b0 + bn], total[b0 : b0 + bn]), r
