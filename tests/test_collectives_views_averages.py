"""Edges of gradwire.collectives: averages of fp16 values whose sum over ranks
overflows where their mean does not, a view whose bytes are not its values (conjugate) refused
on one rank only, an allgather whose input partly overlaps its own block of the output, and
inputs refused with the wrong advice or a traceback (sparse tensors; execute_local's
buffers)."""

import datetime

import pytest
import torch
from conftest import run_world
from hypothesis import given, settings
from hypothesis import strategies as st

import gradwire.collectives as gc
from gradwire.collectives.agree import RefusedError
from gradwire.collectives.local import execute_local
from gradwire.errors import GradwireError
from gradwire.schedules import registry

WORLD = 3
BIG = 30000.0  # fp16: three ranks' sum (90 000) is inf, their mean is not
MAX_F16 = torch.finfo(torch.float16).max


def _averages(rank: int, p: int) -> dict:
    """Averages over ``p`` ranks, each run on every rank: name -> this rank's result."""
    seen: dict = {}
    for algo in ("ring", "rd", "rhd", "tree", "lp", "dbtree"):
        x = torch.full((7,), BIG, dtype=torch.float16)
        gc.all_reduce(x, op="avg", algo=algo)
        seen[f"all_reduce/{algo}"] = x.tolist()
    x = torch.full((7,), BIG, dtype=torch.float16)
    gc.reduce(x, dst=1, op="avg")
    if rank == 1:
        seen["reduce"] = x.tolist()
    inp = torch.full((3 * p,), BIG, dtype=torch.float16)
    kept = inp.clone()
    out = torch.zeros(3, dtype=torch.float16)
    gc.reduce_scatter_tensor(out, inp, op="avg")
    seen["reduce_scatter"] = out.tolist()
    seen["reduce_scatter input kept"] = torch.equal(inp, kept)
    # one rank's values at risk: every rank must take the same path (the others' values are
    # small, and a mismatched path would give a wrong mean, or no mean at all)
    y = torch.full((5,), BIG if rank == 0 else 3.0, dtype=torch.float16)
    gc.all_reduce(y, op="avg", algo="ring")
    seen["one rank big"] = y.tolist()
    # where the sum fits, the average is still the sum divided (exact for these values)
    z = torch.full((4,), float(rank + 1), dtype=torch.float16)
    gc.all_reduce(z, op="avg")
    seen["small"] = z.tolist()
    return seen


@pytest.fixture(scope="module")
def averages(tmp_path_factory) -> list[dict]:
    return run_world(_averages, WORLD, tmp_path_factory.mktemp("avg"))


def test_fp16_averages_whose_sum_overflows_are_the_mean(averages):
    """Three ranks' fp16 30 000: the sum (90 000) is inf in fp16, the mean is 30 000. The
    average summed first, then divided, and every rank ended with inf (c10d's NCCL average
    scales before it sums)."""
    for rank, seen in enumerate(averages):
        for name, got in seen.items():
            if name in ("one rank big", "small", "reduce_scatter input kept"):
                continue
            assert got == [BIG] * len(got), (rank, name, got)
        assert seen["reduce_scatter input kept"]
        want = torch.tensor((BIG + 3.0 + 3.0) / WORLD, dtype=torch.float16).item()
        assert seen["one rank big"] == pytest.approx([want] * 5, rel=1e-3), (rank, seen)
        assert seen["small"] == [2.0] * 4
    assert "reduce" in averages[1]
    assert len({str(s["one rank big"]) for s in averages}) == 1  # the same on every rank


def _conjugate(rank: int, p: int) -> dict:
    """Rank 0 broadcasts a conjugate view (its bytes are not its values); the others plain
    tensors. Then a matched call."""
    seen: dict = {}
    x = torch.full((3,), 1 + 2j, dtype=torch.complex64)
    try:
        gc.broadcast(x.conj() if rank == 0 else x, src=0)
        seen["first"] = "ran"
    except Exception as e:  # noqa: BLE001 (the error is what is checked)
        seen["first"] = f"{type(e).__name__}: {e}"
    y = torch.full((3,), float(rank))
    gc.broadcast(y, src=0)
    seen["next"] = y.tolist()
    return seen


def test_a_conjugate_view_one_rank_broadcasts_fails_every_rank_at_once(tmp_path):
    """The refusal came from the transport, at rank 0's first send, after the header exchange:
    its peers had posted their receives and waited on it (until GRADWIRE_TIMEOUT, or until it
    exited) instead of raising at once naming it."""
    seen = run_world(_conjugate, 2, tmp_path)
    assert seen[0]["first"].startswith("GradwireError: ") and "conj" in seen[0]["first"]
    assert seen[1]["first"].startswith(f"{RefusedError.__name__}: "), seen[1]
    assert "rank 0 refused it" in seen[1]["first"] and "conj" in seen[1]["first"]
    assert [s["next"] for s in seen] == [[0.0] * 3] * 2


def _overlap(rank: int, p: int) -> dict:
    """An allgather whose input, on rank 1, is a slice of its output that overlaps its own
    block in part (elements 2..5 of 8, its block 4..7)."""
    out = torch.arange(8.0) + 10 * rank
    inp = out[2:6] if rank == 1 else torch.tensor([1.0, 2.0, 3.0, 4.0])
    try:
        gc.all_gather_into_tensor(out, inp)
        return {"out": out.tolist()}
    except Exception as e:  # noqa: BLE001 (the error is what is checked)
        return {"error": f"{type(e).__name__}: {e}"}


def test_an_allgather_input_overlapping_its_own_block_in_part_is_gathered(tmp_path):
    """Rank 1's input copy into its block raised RuntimeError (torch refuses a copy between
    tensors that overlap in part) after the header exchange: a traceback there, and rank 0
    waited on it."""
    seen = run_world(_overlap, 2, tmp_path)
    want = [1.0, 2.0, 3.0, 4.0, 12.0, 13.0, 14.0, 15.0]
    assert seen == [{"out": want}, {"out": want}]


def test_a_conjugate_view_is_refused_with_one_line_at_one_rank(one_rank):
    """At P = 1 nothing is sent, so the transport never saw the view, and the broadcast ran
    as if its bytes were its values; it is refused as the transport refuses it, naming it."""
    bad = torch.full((3,), 1 + 2j, dtype=torch.complex64).conj()
    with pytest.raises(GradwireError) as e:
        gc.broadcast(bad, src=0)
    assert str(e.value).startswith("tensor: ") and "conjugate" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_sparse_tensor_is_refused_as_sparse(one_rank):
    """The refusal said "must be contiguous: call .contiguous() first", which a sparse tensor
    cannot follow (.contiguous() leaves it sparse)."""
    with pytest.raises(GradwireError) as e:
        gc.all_reduce(torch.ones(3).to_sparse())
    assert "dense" in str(e.value) and "to_dense()" in str(e.value)


def test_an_allgather_input_anywhere_in_its_output_is_gathered(one_rank):
    """At P = 1 the output is the input: wherever the input lies in the output's storage (its
    block, elements past it, or elements that overlap it in part), the output ends with the
    input's values as they were."""
    @given(n=st.integers(1, 12), k=st.integers(0, 24))
    @settings(max_examples=40, deadline=None)
    def gathered(n, k):
        base = torch.arange(float(n + k + n))
        out, inp = base[:n], base[k : k + n]
        want = inp.tolist()
        gc.all_gather_into_tensor(out, inp)
        assert out.tolist() == want

    gathered()


@pytest.mark.parametrize(("buffers", "says"), [
    (lambda: [torch.zeros(1).expand(4), torch.ones(4)], "stride 0"),
    (lambda: [[0.0] * 4, torch.ones(4)], "must be a torch.Tensor, got list"),
])
def test_execute_local_refuses_buffers_it_cannot_write_with_one_line(buffers, says):
    """An expanded buffer failed at its first write with torch's RuntimeError; a list with an
    AttributeError."""
    s = registry.schedule("allreduce", "ring", 2, 4)
    with pytest.raises(GradwireError) as e:
        execute_local(s, buffers())
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("timeout", ["x", -1.0, float("nan")])
def test_an_async_wait_refuses_a_timeout_that_is_no_duration(one_rank, timeout):
    """Thread.join raised a TypeError for "x" (and took nan or -1 as no wait at all)."""
    h = gc.all_reduce(torch.ones(4), async_op=True)
    with pytest.raises(GradwireError, match="timeout must be None, a timedelta or a number"):
        h.wait(timeout)
    assert h.wait(datetime.timedelta(seconds=5)) and h.wait(0) and h.wait()
