"""The schedules package at its edges: properties over wider P, counts and parameters than the
sweeps of test_schedules*.py, the symbolic checker's memory at P in the hundreds, and one-line
refusals that name what the caller asked for."""
import tracemalloc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.check import ScheduleError, check
from gradwire.schedules.ir import Schedule, Step, Transfer, blocks


@st.composite
def _params(draw, algo, p: int, n: int) -> dict:
    """Parameters ``algo`` takes, drawn within what it accepts."""
    out: dict = {}
    if algo.name in ("lp", "dbtree") and draw(st.booleans()):
        out["block"] = draw(st.integers(1, n + 3))
    if algo.name == "dbtree" and "block" not in out and draw(st.booleans()):
        out.update(sndbuf=draw(st.integers(1, 64)), alpha=1e-4)
    if algo.name == "ring" and draw(st.booleans()):
        out["pipeline"] = draw(st.integers(1, 8))
    if algo.name == "ps":
        out["servers"] = draw(st.integers(1, p))
        if draw(st.booleans()):
            cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
            out.update(sharding="roundrobin", tensor_sizes=tuple(
                b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)))
    return out


@given(data=st.data(), algo=st.sampled_from(registry.ALGORITHMS), p=st.integers(1, 40),
       n=st.integers(0, 200))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_every_schedule_keeps_its_promise_for_any_p_count_root_and_parameters(
        data, algo, p, n):
    root = data.draw(st.integers(0, p - 1)) if algo.rooted else 0
    check(registry.schedule(algo.collective, algo.name, p, n, root,
                            **data.draw(_params(algo, p, n))))


@given(data=st.data(), algo=st.sampled_from(registry.algorithms("allreduce")),
       p=st.integers(1, 40), n=st.integers(0, 200), seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None, derandomize=True)
def test_every_allreduce_leaves_every_rank_the_full_sum(data, algo, p, n, seed):
    """On numbers (integer-valued float64: exact in any order), not tokens."""
    s = registry.schedule("allreduce", algo.name, p, n, **data.draw(_params(algo, p, n)))
    g = torch.Generator().manual_seed(seed)
    given_ = [torch.randint(-9, 10, (n,), generator=g).double() for _ in range(p)]
    bufs = [b.clone() for b in given_]
    execute_local(s, bufs)
    total = torch.stack(given_).sum(0)
    for r in range(p):
        assert torch.equal(bufs[r], total), r


# The symbolic checker at large P ------------------------------------------------------------
def _peak_bytes_checking(s: Schedule) -> int:
    """The most memory ``check(s)`` held at once (numpy's arrays included)."""
    tracemalloc.start()
    try:
        check(s)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _state_bytes(s: Schedule) -> int:
    """The token state's size: P ranks × n elements × (P + 1) int64 counts."""
    return s.world_size * s.count * (s.world_size + 1) * 8


@pytest.mark.parametrize("collective,name,count", [("allreduce", "master", 0),
                                                   ("allgather", "ring", 2),
                                                   ("broadcast", "binomial", 1)])
def test_the_checker_is_not_cubic_in_the_world_size(collective, name, count):
    """expected_state built a (P + 1)-square identity matrix for each rank and kept them all:
    O(P³) time and memory, 1 GB to check a 512-rank schedule of no elements, 3 s at P = 1000,
    and a 1536-rank allgather of 2 elements was killed for memory (29 GB)."""
    s = registry.schedule(collective, name, 512, count)
    assert _peak_bytes_checking(s) < 2 * _state_bytes(s) + 8 * 2**20


def test_the_checker_copies_what_a_step_sends_not_the_whole_state():
    """Every step copied the whole token state (P·n·(P + 1) counts) to read its sends from:
    an LP broadcast of 32 one-element blocks over 256 ranks copied 17 MB in each of its 286
    steps (134 MB a step at 512 ranks and 64 blocks: tens of seconds), where its sends are 32
    elements a step at most."""
    s = registry.schedule("broadcast", "lp", 256, 32, block=1)
    assert _peak_bytes_checking(s) < 1.5 * _state_bytes(s)


def test_the_checker_still_reads_a_steps_sends_before_its_receives_land():
    """Rank 1 sums into rank 0, then the two swap buffers in one step: each ends with what the
    other held before the step, as the executor's rule has it (applied one after the other,
    both would end with the sum and the broken schedule would pass)."""
    gather = Step((Transfer(1, 0, 0, 3, "sum"),))
    swap = Schedule("swap", "allreduce", 2, 3,
                    (gather, Step((Transfer(0, 1, 0, 3), Transfer(1, 0, 0, 3)))))
    with pytest.raises(ScheduleError, match=r"rank 0 element 0 holds \{1\} but should hold "
                                            r"\{0, 1\}"):
        check(swap)
    check(Schedule("back", "allreduce", 2, 3, (gather, Step((Transfer(0, 1, 0, 3),)))))


def test_an_allgather_with_fewer_elements_than_ranks_still_names_a_missing_block():
    s = registry.schedule("allgather", "ring", 7, 3)
    broken = Schedule("x", "allgather", 7, 3, s.steps[:-1])
    with pytest.raises(ScheduleError, match=r"x allgather p=7 n=3: rank \d element \d holds "
                                            r"\{garbage\} but should hold \{\d\}"):
        check(broken)
    check(s)
    assert blocks(3, 7)[3] == (3, 0)  # the empty blocks it no longer lists


# One-line refusals that name what was asked ------------------------------------------------
@pytest.mark.parametrize("op", [5, "copy"])
def test_the_tree_allreduce_names_itself_refusing_an_op(op):
    """``algo="tree"`` refused a bad combine as "binomial: op must name a combine": the
    name of another registry entry (broadcast and reduce), not the algorithm asked for."""
    with pytest.raises(GradwireError, match=rf"^tree: op must name a combine \(e\.g\. 'sum'\), "
                                            rf"got {op!r}$"):
        registry.schedule("allreduce", "tree", 4, 10, op=op)


def test_a_dbtree_block_cutting_too_many_blocks_names_the_buffer_it_was_given():
    """dbtree cuts each half of the buffer into blocks; the refusal named the half's count as
    if it were the buffer ("cuts 20000 elements" of a 40000-element buffer)."""
    with pytest.raises(GradwireError) as e:
        registry.schedule("allreduce", "dbtree", 4, 40000, block=1)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("block=1 cuts 20000 elements (each half of 40000) into 20000 "
                          "blocks"), msg
    assert msg.endswith("so block >= 2 here")
    # LP, one pipeline over the whole buffer, says it as before
    with pytest.raises(GradwireError, match=r"^block=1 cuts 40000 elements into 40000 blocks"):
        registry.schedule("allreduce", "lp", 4, 40000, block=1)
