"""The README's Python API as a new user calls it, with the mistakes and edge cases such a user
makes: each check here failed before its fix (a deep traceback, a rank left waiting or out of
step, a call that ran on other ranks than asked, mass lost from the residual)."""

import pytest
import torch
import torch.distributed as dist
from conftest import run_world

import gradwire.collectives as gc
import gradwire.hooks as gh
import gradwire.sparse as gs
from gradwire.errors import GradwireError
from gradwire.transport import Transport


def _said(call) -> str:
    """What ``call()`` raised, as ``Type: message`` ("ok" if nothing)."""
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


# sparse_allreduce's timings= ----------------------------------------------------------------

@pytest.mark.parametrize("timings", [[], "select", 0.0])
def test_sparse_allreduce_refuses_bad_timings_before_the_residual_moves(one_rank, timings):
    """timings= is written into after error feedback has added x into the residual and taken
    the selection out: a list there raised "list indices must be integers or slices, not
    str" with nothing sent, x's mass and the selection lost from the residual."""
    x, residual = torch.arange(1.0, 7.0), torch.zeros(6)
    with pytest.raises(GradwireError) as e:
        gs.sparse_allreduce(x, residual, 2, "gtopk", timings=timings)
    assert "timings must be None or a dict" in str(e.value) and "\n" not in str(e.value)
    assert residual.tolist() == [0.0] * 6 and x.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    seen: dict = {}
    gs.sparse_allreduce(x, residual, 2, "gtopk", timings=seen)  # a dict is still taken
    assert set(seen) == {"select"}


# group= beside transport= -------------------------------------------------------------------

def test_a_group_other_than_the_transports_is_refused(one_rank):
    """transport= (for its byte counters) won over group= without a word: the call ran on
    the transport's group, so ranks outside the group asked for took part, and met whatever
    those ranks called next."""
    sub = dist.new_group([0])
    x = torch.ones(3)
    for call in (lambda: gc.all_reduce(x, group=sub, transport=Transport()),
                 lambda: gs.sparse_allreduce(x, torch.zeros(3), 1, group=sub,
                                             transport=Transport())):
        said = _said(call)
        assert said.startswith("GradwireError: ") and "name different process groups" in said
    # the same group both ways, and the default group spelled either way, are one group
    gc.all_reduce(x, group=sub, transport=Transport(sub))
    gc.all_reduce(x, group=dist.group.WORLD, transport=Transport())
    assert x.tolist() == [1.0] * 3


def test_a_rank_outside_the_group_is_told_so(one_rank):
    """dist.new_group gives a rank outside the group GroupMember.NON_GROUP_MEMBER, the int
    -100: sparse_allreduce and make(group=) answered "... ProcessGroup ..., got -100"."""
    outside = dist.GroupMember.NON_GROUP_MEMBER
    for call in (lambda: gs.sparse_allreduce(torch.ones(4), torch.zeros(4), 1, group=outside),
                 lambda: gh.make("topk", group=outside)):
        said = _said(call)
        assert said.startswith("GradwireError: ") and "this rank is not in the group" in said
    gc.all_reduce(torch.ones(2), group=outside)  # c10d's rule: a collective does nothing there


# inference tensors, reduced outside inference mode --------------------------------------------

def _inference_rank(rank: int, world: int) -> dict:
    """Each collective on tensors made under torch.inference_mode, called after it, beside
    dist.all_reduce's answer (c10d takes such tensors)."""
    seen: dict = {}
    with torch.inference_mode():
        mine = torch.arange(4.0) + 10 * rank
        summed = mine.clone()
        averaged = mine.clone()
        reduced = mine.clone()
        gathered = torch.zeros(4 * world)
        scattered = torch.zeros(4 // world)
        want = mine.clone()
    dist.all_reduce(want)
    seen["want"] = want.tolist()
    seen["all_reduce"] = _said(lambda: gc.all_reduce(summed, algo="ring"))
    seen["sum"] = summed.tolist()
    seen["avg_call"] = _said(lambda: gc.all_reduce(averaged, op="avg", algo="rhd",
                                                   async_op=True).wait())
    seen["avg"] = averaged.tolist()
    seen["reduce"] = _said(lambda: gc.reduce(reduced, dst=world - 1, algo="binomial"))
    seen["reduced"] = reduced.tolist()
    seen["gather"] = _said(lambda: gc.all_gather_into_tensor(gathered, mine))
    seen["gathered"] = gathered.tolist()
    seen["scatter"] = _said(lambda: gc.reduce_scatter_tensor(scattered, mine))
    seen["scattered"] = scattered.tolist()
    # the calls left the ranks in step, and normal tensors as they were
    after = torch.ones(2)
    gc.all_reduce(after)
    seen["after"] = after.tolist()
    return seen


def test_collectives_write_inference_tensors_outside_inference_mode(tmp_path):
    """A metric computed under torch.inference_mode and reduced after it: dist.all_reduce
    takes it, gradwire's all_reduce, all_gather_into_tensor and reduce_scatter_tensor raised
    torch's "Inplace update to inference tensor outside InferenceMode" from inside the
    schedule, after the call's header exchange."""
    world = 2
    ranks = run_world(_inference_rank, world, tmp_path)
    want = ranks[0]["want"]
    for rank, seen in enumerate(ranks):
        for call in ("all_reduce", "avg_call", "reduce", "gather", "scatter"):
            assert seen[call] == "ok", (rank, call, seen[call])
        assert seen["sum"] == want
        assert seen["avg"] == [v / world for v in want]
        assert seen["gathered"] == [v + 10 * r for r in range(world) for v in range(4)]
        assert seen["scattered"] == want[2 * rank : 2 * rank + 2]
        assert seen["after"] == [float(world)] * 2
    assert ranks[world - 1]["reduced"] == want


# gtopk_allreduce's algo= ----------------------------------------------------------------------

def _gtopk_algo_rank(rank: int, world: int) -> dict:
    """Rank 1 names a schedule gTop-k does not run; then every rank makes one more call."""
    residual = torch.zeros(8)
    seen = {"gtopk": _said(lambda: gs.gtopk_allreduce(
        torch.ones(2), torch.tensor([rank, 7]), 8, residual,
        algo="ring" if rank == 1 else None))}
    after = torch.ones(2)
    seen["after"] = _said(lambda: gc.all_reduce(after))
    seen["residual"] = residual.tolist()
    return seen


def test_gtopk_allreduce_bad_algo_on_one_rank_fails_every_rank_at_once(tmp_path):
    """gtopk_allreduce checked algo= only once the call's header exchange had begun on the
    other ranks: the refusing rank raised alone, the others waited for its header and met its
    next call's instead (a MismatchError, and the ranks out of step from then on), or, had
    it made none, timed out."""
    first, second = run_world(_gtopk_algo_rank, 2, tmp_path)
    assert first["gtopk"].startswith("RefusedError: ") and "rank 1 refused it" in first["gtopk"]
    assert second["gtopk"].startswith("GradwireError: gtopk_allreduce: gtopk runs") and \
        "algo='ring'" in second["gtopk"]
    for seen in (first, second):
        assert "\n" not in seen["gtopk"]
        assert seen["after"] == "ok"  # still in step
        assert seen["residual"] == [0.0] * 8  # no merge ran, no drop reached it
