"""Edges of gradwire.collectives' API that c10d's own collectives handle: calls in flight at
once reading their inputs in issue order, roots given as numpy integers under a subgroup,
inference mode (the caller's, on the async helper thread; and the work buffers a call in it
leaves in the pool), and ReduceOp objects."""

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import run_world

import gradwire.collectives as gc
from gradwire.collectives import api
from gradwire.collectives.pool import BufferPool
from gradwire.errors import GradwireError

WORLD = 3


def _checks(rank: int, p: int) -> dict:
    """What each check saw on this rank (every rank makes the same calls in the same order)."""
    seen: dict = {}
    # an allgather issued while an async allreduce of its input is in flight must gather the
    # reduced input, as c10d runs a group's calls in issue order (rank 1 comes late, so the
    # allreduce is still in flight on the others when they issue the allgather)
    x = torch.ones(4)
    if rank == 1:
        time.sleep(1.0)
    h1 = gc.all_reduce(x, async_op=True)
    out = torch.zeros(4 * p)
    h2 = gc.all_gather_into_tensor(out, x, async_op=True)
    h1.wait()
    h2.wait()
    seen["allgather"] = out.tolist()
    # roots are global ranks under a subgroup, numpy integers too (the registry takes them)
    members = [1, 2]
    g = dist.new_group(members)
    y = torch.full((3,), float(rank))
    gc.broadcast(y, src=np.int64(1), group=g)
    seen["broadcast"] = y.tolist()
    z = torch.full((3,), float(rank))
    try:  # raises on both members alike, or on neither
        gc.reduce(z, dst=np.int64(2), group=g)
        seen["reduce"] = z.tolist()
    except GradwireError as e:
        seen["reduce"] = str(e)
    if rank in members:  # a bool is no rank: refused on both members, as on the default group
        try:
            gc.broadcast(torch.zeros(2), src=True, group=g)
            seen["bool_root"] = "taken"
        except GradwireError as e:
            seen["bool_root"] = str(e)
    # last: where it fails, it leaves receives posted
    with torch.inference_mode():
        w = torch.ones(5)
        try:
            gc.all_reduce(w, async_op=True).wait()
            seen["inference"] = w.tolist()
        except RuntimeError as e:
            seen["inference"] = str(e).splitlines()[0]
    return seen


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> list[dict]:
    """Every rank's ``_checks`` of one run of WORLD gloo ranks."""
    return run_world(_checks, WORLD, tmp_path_factory.mktemp("edges"))


def test_an_allgather_reads_its_input_in_issue_order(world):
    for seen in world:
        assert seen["allgather"] == [float(WORLD)] * 4 * WORLD


def test_subgroup_roots_given_as_numpy_integers_are_global_ranks(world):
    assert [seen["broadcast"] for seen in world] == [[0.0] * 3, [1.0] * 3, [1.0] * 3]
    assert world[2]["reduce"] == [3.0] * 3
    for r in (1, 2):
        said = world[r]["bool_root"]
        assert "root must be a rank in 0..1, got True" in said and "\n" not in said


def test_async_calls_run_in_the_callers_inference_mode(world):
    for seen in world:
        assert seen["inference"] == [float(WORLD)] * 5


def test_async_average_in_inference_mode_on_one_rank(one_rank):
    with torch.inference_mode():
        x = torch.full((4,), 3.0)
        gc.all_reduce(x, op="avg", async_op=True).wait()
        out = torch.zeros(4)
        gc.reduce_scatter_tensor(out, torch.ones(4), async_op=True).wait()
    assert x.tolist() == [3.0] * 4 and out.tolist() == [1.0] * 4


def test_a_call_in_inference_mode_leaves_the_work_buffers_writable(one_rank, monkeypatch):
    """reduce_scatter_tensor's work buffer goes back to a pool: one made in inference mode
    (an inference tensor) must not break the next call made outside it."""
    monkeypatch.setattr(api, "WORK_BUFFERS", BufferPool(2**20))
    with torch.inference_mode():
        gc.reduce_scatter_tensor(torch.zeros(4), torch.ones(4))
    out = torch.zeros(4)
    gc.reduce_scatter_tensor(out, torch.arange(4.0))
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(("op", "want"), [(dist.ReduceOp.SUM, 2.0), (dist.ReduceOp.AVG, 2.0)])
def test_reduce_op_objects_are_taken_as_c10d_takes_them(one_rank, op, want):
    x = torch.full((3,), 2.0)
    gc.all_reduce(x, op=dist.ReduceOp(op))  # an instance, not the enum value
    assert x.tolist() == [want] * 3
    with pytest.raises(GradwireError, match="reduction op .*BAND.* is not supported") as e:
        gc.all_reduce(x, op=dist.ReduceOp(dist.ReduceOp.BAND))
    assert "object at 0x" not in str(e.value)


def test_a_call_interrupted_while_waiting_for_its_turn_does_not_hold_up_later_ones(monkeypatch):
    """Ctrl-C on a call that waits behind another one of its group: its turn is dropped, and
    the calls issued after it run once the one before it ends, instead of waiting forever."""
    import threading

    turns = api._Turns()
    first, interrupted, later = turns.take(), turns.take(), turns.take()
    wait_for = turns._cond.wait_for

    def ctrl_c(predicate, timeout=None):
        monkeypatch.setattr(turns._cond, "wait_for", wait_for)
        raise KeyboardInterrupt

    monkeypatch.setattr(turns._cond, "wait_for", ctrl_c)
    with pytest.raises(KeyboardInterrupt), turns.turn(interrupted):
        pass
    ran = threading.Event()

    def run_later() -> None:
        with turns.turn(later):
            ran.set()

    t = threading.Thread(target=run_later, daemon=True)
    t.start()
    assert not ran.wait(0.2)  # the first call still holds the group
    with turns.turn(first):
        pass
    assert ran.wait(5), "the call after the interrupted one never ran"
    t.join(5)


def test_a_list_and_a_tuple_of_the_same_sizes_make_the_same_call():
    """The registry takes either for a parameter of integers; ranks that pass one each agree."""
    assert api.shown_params({"sizes": [3, 4], "itemsize": 4}) == api.shown_params(
        {"itemsize": 4, "sizes": (3, 4)}) == "itemsize=4,sizes=(3, 4)"
