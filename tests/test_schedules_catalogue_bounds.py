"""Defects found in the schedules and the catalogue: a ring pipeline cut into millions of
sub-chunks (built until memory ran out), plans of impossible buckets (negative bytes, an empty
allgather, tracebacks), options the dense method silently ignored, and a link so slow that
every cost was NaN."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire import catalogue
from gradwire.errors import GradwireError
from gradwire.schedules import registry, ring
from gradwire.schedules.check import check
from gradwire.schedules.cost import CostParams, cost
from gradwire.schedules.lp import MAX_BLOCKS


# ring: a given pipeline is bounded as lp's blocks are ----------------------------------------
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather"])
def test_a_ring_pipeline_past_max_blocks_sub_chunks_is_one_line(collective):
    """pipeline=10**7 of 10**9 elements at P = 4 built 240 M transfers (out of memory, never
    an error); lp refuses a block that cuts more than MAX_BLOCKS. The ring now refuses a
    pipeline that cuts the buffer into more than MAX_BLOCKS sub-chunks (at least
    MAX_PIPELINE per chunk), before building anything."""
    p = 4
    most = MAX_BLOCKS // p
    count = p * (most + 1)
    for make in (registry.schedule, registry.table):
        with pytest.raises(GradwireError, match=rf"pipeline={most + 1} cuts each of 4 chunks "
                                                rf"into {most + 1} sub-chunks.*at most {most} "
                                                r"at p=4") as e:
            make(collective, "ring", p, count, pipeline=most + 1)
        assert "\n" not in str(e.value)
    # at the bound it builds; more than a chunk's elements is cut to them, as before
    assert registry.table(collective, "ring", p, count, pipeline=most,
                          cached=False).size.max() == 2  # most + 1 elements in most pieces
    assert registry.schedule(collective, "ring", p, 10, pipeline=10**12).params["pipeline"] == 3


@given(p=st.integers(1, 16), count=st.integers(0, 100_000), pipeline=st.integers(1, 10**6))
@settings(max_examples=40, deadline=None)
def test_an_accepted_ring_pipeline_cuts_at_most_max_pipeline_per_chunk(p, count, pipeline):
    """Whatever pipeline is given, what is built has at most max(MAX_PIPELINE, MAX_BLOCKS/p)
    sub-chunks per chunk, so at most 2(p − 1)·that messages per link."""
    try:
        t = registry.table("allreduce", "ring", p, count, pipeline=pipeline, cached=False)
    except GradwireError as e:
        assert "at most" in str(e) and pipeline > ring.max_pipeline(p)
        return
    per_link = max(ring.MAX_PIPELINE, MAX_BLOCKS // p)
    assert len(t.size) <= 2 * max(p - 1, 0) * p * per_link
    if p <= 8 and count <= 200:
        check(registry.schedule("allreduce", "ring", p, count, pipeline=pipeline))


# catalogue: a plan of an impossible bucket is a one-line error -------------------------------
@pytest.mark.parametrize("name", list(catalogue.METHODS))
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"numel": -1}, r"numel \(elements in the bucket\) must be an integer >= 0, got -1"),
    ({"numel": 10.5}, r"numel .* must be an integer >= 0, got 10\.5"),
    ({"numel": "1000"}, r"numel .* must be an integer >= 0, got '1000'"),
    ({"numel": True}, r"numel .* got True"),
    ({"world": 0}, r"world \(ranks\) must be an integer >= 1, got 0"),
    ({"world": -2}, r"world .* got -2"),
    ({"world": 2.5}, r"world .* got 2\.5"),
    ({"dtype": torch.int32}, r"dtype must be a gradient's float dtype .* got torch\.int32"),
    ({"dtype": "float32"}, r"dtype must be .* got 'float32'"),
])
def test_a_plan_of_an_impossible_bucket_is_one_line(name, kwargs, match):
    """plan(numel=-1) planned -4 bytes for dense, fp16 and int8; world=0 an allgather of 0
    bytes for every gathered method; numel='1000' and dtype='float32' were TypeErrors and
    AttributeErrors; an int32 'gradient' was planned as if it were one."""
    args = {"numel": 1000, "world": 4, "dtype": torch.float32, **kwargs}
    with pytest.raises(GradwireError, match=rf"^{name}: {match}") as e:
        catalogue.get(name).plan(args["numel"], args["world"], args["dtype"], density=0.01)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["topk", "gtopk", "randomk", "dgc"])
@pytest.mark.parametrize("density", [None, 0, -0.5, 1.5, math.nan])
def test_a_plan_at_a_density_out_of_range_is_one_line(name, density):
    """density=None was an AssertionError; with a compressor at hand, 0 or -0.5 planned one
    entry and 1.5 every element, where the compressor itself refuses them."""
    m = catalogue.get(name)
    with pytest.raises(GradwireError, match=rf"{name}: density must be in \(0, 1\]"):
        m.plan(1000, 4, density=density)
    with pytest.raises(GradwireError, match=rf"{name}: density must be in \(0, 1\]"):
        m.plan(1000, 4, compressor=m.make_compressor(0.01), density=density)


def test_plans_of_possible_buckets_are_unchanged():
    for name, m in catalogue.METHODS.items():
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            plan = m.plan(0, 1, dtype, density=1.0)
            assert plan.dense and plan.sent == 0, name
    assert catalogue.get("dense").plan(1000, 3).sent == 4000
    assert catalogue.get("topk").plan(1000, 4, density=0.01).sent == 80


# catalogue: the dense method has no compressor options ---------------------------------------
@pytest.mark.parametrize("params", [{"bogus": 1}, {"rank": 4}, {"pipeline": 4}])
def test_dense_refuses_compressor_options_in_one_line(params):
    """compress=dense:bogus=1 (the simulator's mechanism) was accepted and the option ignored,
    where every other method refuses an option its compressor does not take."""
    m = catalogue.get("dense")
    key = next(iter(params))
    with pytest.raises(GradwireError, match=rf"^dense: unknown parameter '{key}': expected "
                                            "no parameters"):
        m.compressor_from(params)
    with pytest.raises(GradwireError, match="dense: unknown parameter"):
        m.make_compressor(0.001, **params)
    assert m.compressor_from({}) == (None, 0.001)
    assert m.make_compressor(0.5, seed=3) is None


def test_a_simulated_mechanism_with_dense_options_is_refused():
    from gradwire.sim import mechanisms

    with pytest.raises(GradwireError, match="mechanism 'ring:compress=dense:bogus=1': dense: "
                                            "unknown parameter 'bogus'"):
        mechanisms.parse("ring:compress=dense:bogus=1")
    assert mechanisms.parse("ring:compress=dense").options.compressor == "dense"


# cost: a link too slow for a finite β ----------------------------------------------------------
@pytest.mark.parametrize("bps", [1e-309, 5e-324])
def test_a_link_whose_byte_time_is_infinite_is_one_line(bps):
    """A subnormal bandwidth passed (> 0, finite) but made β = 8/bps = inf, and the cost of
    every schedule NaN (inf·0 for the ranks that do not send in a step)."""
    with pytest.raises(GradwireError, match="bandwidth .* finite time") as e:
        CostParams.for_link(bps)
    assert "\n" not in str(e.value)
    slow = CostParams.for_link(1e-300)  # slow, but every cost is a number
    assert not math.isnan(cost(registry.schedule("allreduce", "tree", 3, 10), slow))
