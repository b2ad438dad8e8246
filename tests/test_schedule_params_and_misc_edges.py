"""Edges of schedules, jobs and models: numpy integers as schedule parameters, an
itemsize past any buffer, the ring's automatic cut past a chunk's elements, a parameter
server asked for unboundedly many tensors, an overlong progress line, a NaN perplexity."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.errors import GradwireError
from gradwire.jobs import _progress
from gradwire.models.task import perplexity
from gradwire.schedules import registry
from gradwire.schedules.check import check
from gradwire.schedules.lp import MAX_BLOCKS


@pytest.mark.parametrize("kind", [np.int16, np.int32, np.int64])
def test_a_numpy_block_builds_what_a_python_one_does(kind):
    """block=np.int32(200000) of 10**9 elements: block·MAX_BLOCKS wrapped in int32 and the
    5000 blocks were refused as too many (np.int16: an OverflowError)."""
    block = 200000 if kind is not np.int16 else 20000
    count = 10**9 if kind is not np.int16 else 10**8
    got = registry.schedule("broadcast", "lp", 4, count, block=kind(block))
    assert got.params["block"] == block and type(got.params["block"]) is int
    assert got == registry.schedule("broadcast", "lp", 4, count, block=block)


@pytest.mark.parametrize("algo,extra", [(("allreduce", "ring"), {}),
                                        (("allreduce", "dbtree"), {}),
                                        (("allreduce", "lp"), {}),
                                        (("allreduce", "ps"), {"servers": np.uint8(3)})])
@settings(max_examples=10, deadline=None)
@given(p=st.integers(1, 9), n=st.integers(3000, 20000))
def test_numpy_integer_parameters_build_the_python_integers_schedule(algo, extra, p, n):
    """itemsize=np.uint8(4): the builders' count·itemsize overflowed uint8 (OverflowError)."""
    if "servers" in extra and p < 3:
        extra = {"servers": np.uint8(p)}
    got = registry.schedule(*algo, p, n, itemsize=np.uint8(4), **extra)
    want = registry.schedule(*algo, p, n, itemsize=4, **{k: int(v) for k, v in extra.items()})
    assert got == want and got.params == want.params
    check(got)


@pytest.mark.parametrize("algo", [("allreduce", "lp"), ("broadcast", "lp"),
                                  ("allreduce", "dbtree"), ("allreduce", "ring")])
def test_an_itemsize_past_any_buffer_is_one_line(algo):
    """itemsize=10**400 (a number written out in a --param) passed the check and LP's b* made
    count·itemsize a float: an OverflowError."""
    with pytest.raises(GradwireError, match=r"itemsize=1000.*: expected an integer >= 1 .*"
                                            r"at most 1125899906842624") as e:
        registry.schedule(*algo, 4, 100, itemsize=10**400)
    assert "\n" not in str(e.value)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 8), per=st.integers(1, 6), shift=st.integers(20, 30))
def test_the_rings_own_cut_is_never_more_than_a_chunks_elements(p, per, shift):
    """The docstring's promise: with elements of 2**shift bytes a chunk of 2 elements was
    recorded as cut in 8 sub-chunks (only 2 of them exist)."""
    count = p * per
    s = registry.schedule("allreduce", "ring", p, count, itemsize=2**shift)
    assert 1 <= s.params["pipeline"] <= -(-count // p)
    check(s)


def test_a_parameter_server_of_more_tensors_than_a_pipelines_blocks_is_one_line():
    """10**6 one-element tensors at P = 4 took 6.5 s to build as 6 M transfers, with no bound
    on more: a tensor is a message from and to every worker."""
    sizes = [1] * (MAX_BLOCKS + 1)
    with pytest.raises(GradwireError, match=f"tensor_sizes names {MAX_BLOCKS + 1} tensors.*"
                                            f"at most {MAX_BLOCKS}"):
        registry.schedule("allreduce", "ps", 2, len(sizes), servers=2, sharding="roundrobin",
                          tensor_sizes=sizes)
    ok = [1] * MAX_BLOCKS
    assert len(registry.schedule("allreduce", "ps", 2, len(ok), servers=2,
                                 sharding="roundrobin", tensor_sizes=ok).steps) == 2


@pytest.mark.parametrize("digits", [4301, 5000])
def test_a_progress_line_of_a_number_too_long_for_int_is_the_ranks_output(digits):
    """int() refuses more than 4300 digits: its ValueError in the sink stopped the run."""
    assert _progress(f"GW_PROGRESS 1 {'9' * digits}") is None
    assert _progress(f"GW_PROGRESS {'9' * digits} 10") is None
    assert _progress("GW_PROGRESS 3 10") == (3, 10)


def test_the_perplexity_of_a_nan_loss_is_nan_not_inf():
    assert math.isnan(perplexity(math.nan))
    assert perplexity(800.0) == math.inf and perplexity(1.0) == pytest.approx(math.e)


def test_lp_given_a_numpy_block_directly_counts_its_blocks_in_python_ints():
    """The registry turns numpy ints into Python ints; lp.pick_block called directly took
    np.int32(200000) × MAX_BLOCKS in int32, which wrapped, and refused 10**9 elements."""
    from gradwire.schedules import lp

    assert lp.pick_block(10**9, 1, np.int32(200_000), 0, 1, 4) == 200_000
    assert type(lp.pick_block(10**9, 1, np.int64(300_000), 0, 1, 4)) is int
