"""Every registered algorithm, executed over gloo for P in {1,2,3,4,5,7,8}, equals
torch.distributed's own collective, and the transport counts exactly the schedule's bytes."""
import itertools

import pytest
import torch
from conftest import run_checks
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.collectives.executor import Unwritten, _plan
from gradwire.errors import GradwireError
from gradwire.schedules import registry


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8])
def test_every_algorithm_matches_torch_distributed(p):
    run_checks("collectives_check.py", p, timeout=600)


ALGOS = [pytest.param(a, id=f"{a.collective}/{a.name}") for a in registry.ALGORITHMS]


@pytest.mark.parametrize("algo", ALGOS)
@given(p=st.integers(1, 9), n=st.integers(0, 200), rank=st.integers(0, 8))
@settings(max_examples=20, deadline=None)
def test_plan_finds_the_latest_earlier_overlap_of_every_entry(algo, p, n, rank):
    """What lets a receive land in the buffer (no staging copy) is the latest earlier entry of
    the rank's program touching its range; the sweep must equal the pairwise definition."""
    s = registry.schedule(algo.collective, algo.name, p, n)
    program, conflict, last_recv = _plan(s, rank % p)
    assert program == s.program(rank % p)
    for i, (_, _, t) in enumerate(program):
        earlier = [j for j in range(i) if program[j][2].start < t.stop
                   and t.start < program[j][2].stop]
        assert conflict[i] == (earlier[-1] if earlier else -1)
        recvs = [j for j in earlier if program[j][1] == "recv"]
        assert last_recv[i] == (recvs[-1] if recvs else -1)


@pytest.mark.parametrize("collective,algo", [("broadcast", "lp"), ("allgather", "ring"),
                                             ("broadcast", "binomial")])
def test_copies_into_untouched_ranges_need_no_staging(collective, algo):
    lp_block = {"alpha": 3e-4, "beta": 8e-9} if algo == "lp" else {}  # lp picks its block
    s = registry.schedule(collective, algo, 8, 1 << 20, itemsize=4, **lp_block)
    for rank in range(8):
        program, conflict, _ = _plan(s, rank)
        assert all(conflict[i] < 0 for i, (_, kind, _) in enumerate(program) if kind == "recv")


@given(n=st.integers(0, 60), writes=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)),
                                            max_size=12),
       ask=st.tuples(st.integers(0, 60), st.integers(0, 60)))
def test_unwritten_ranges_follow_a_mask(n, writes, ask):
    """Out of place, what a rank has not written is read from the source: the interval set
    must say exactly which elements those are, as a per-element mask would."""
    u, mask = Unwritten(n), [True] * n
    for a, b in writes:
        lo, hi = min(a, b, n), min(max(a, b), n)
        u.write(lo, hi)
        mask[lo:hi] = [False] * (hi - lo)
    lo, hi = min(ask[0], ask[1], n), min(max(ask), n)
    got = [False] * n
    pieces = u.within(lo, hi)
    for a, b in pieces:
        assert lo <= a < b <= hi
        got[a:b] = [True] * (b - a)
    assert got[lo:hi] == mask[lo:hi]
    assert all(x[1] < y[0] for x, y in itertools.pairwise(pieces))


@pytest.mark.parametrize("p", [2, 5])
def test_step_by_step_execution_matches_too(p, monkeypatch):
    """The executor's NCCL path (each step one group of sends and receives, then its
    combines), run over gloo so that CI checks it without a GPU (on a GPU, test_nccl.py runs
    it over NCCL itself)."""
    monkeypatch.setenv("GRADWIRE_TEST_STEPWISE", "1")
    monkeypatch.setenv("SIZES", "0,1,5,13,1000")
    run_checks("collectives_check.py", p, timeout=600)


@pytest.mark.parametrize("call", ["all_reduce", "reduce", "all_gather_into_tensor",
                                  "reduce_scatter_tensor"])
@pytest.mark.parametrize(("kw", "says"), [
    ({"transport": "x"}, "transport must be None or a gradwire.transport.Transport, got 'x'"),
    ({"group": "x"}, "group must be None (the default group) or a torch.distributed "
                     "ProcessGroup"),
])
def test_a_transport_or_group_of_the_wrong_kind_is_one_line(call, kw, says):
    import gradwire.collectives as gc

    t = torch.ones(4)
    args = (t, t) if call in ("all_gather_into_tensor", "reduce_scatter_tensor") else (t,)
    with pytest.raises(GradwireError) as e:
        getattr(gc, call)(*args, **kw)
    assert says in str(e.value) and call in str(e.value) and "\n" not in str(e.value)


def test_the_api_keeps_c10d_semantics():
    """tests/scripts/api_check.py: calls in flight at once run in issue order, subgroup roots
    are global ranks, non-members do nothing, parameters are written in place; P = 3."""
    run_checks("api_check.py", 3, timeout=300)
