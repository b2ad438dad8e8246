"""Edges of the aggregation paths (gradwire.catalogue, gradwire.sparse): averages of 16-bit
buckets, plans that must go dense, and the NaN/Inf policy."""

import contextlib

import pytest
import torch

from gradwire import catalogue
from gradwire.catalogue import AggregationCall, methods
from gradwire.collectives.agree import encode
from gradwire.collectives.local import execute_local
from gradwire.compress import ErrorFeedback
from gradwire.hooks.comm import Comm
from gradwire.sparse.allreduce import feed, plan
from gradwire.syncfree import device_paths


def _sparse_average(method: str, xs: list[torch.Tensor], k: int, device: bool
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(each rank's average, each rank's residual) of one sparse aggregation of ``xs`` with
    zero residuals, all ranks in this process, as the hooks take it (Plan.average)."""
    p, n = len(xs), xs[0].numel()
    residuals = [torch.zeros_like(x) for x in xs]
    with device_paths() if device else contextlib.nullcontext():
        plans = [plan(method, feed(x, r, k, "exact"), k, n, r, rank, p)
                 for rank, (x, r) in enumerate(zip(xs, residuals, strict=True))]
        execute_local(plans[0].schedule, [q.buffer for q in plans],
                      [q.combine for q in plans])
        return [q.average(torch.empty_like(x)) for q, x in zip(plans, xs, strict=True)], \
            residuals


@pytest.mark.parametrize("device", [False, True])
def test_topk_average_of_fp16_values_does_not_overflow_where_the_mean_fits(device):
    """Top-k sums the ranks' entries in fp32; the sum was cast to the bucket's dtype before
    the division by P, so two ranks sending 60 000 in fp16 averaged to inf (a dense allreduce,
    which scales by 1/P first, gives 60 000): the step was lost (or applied as inf)."""
    dtype, big = torch.float16, 60000.0
    xs = [torch.tensor([big, 1.0, 0.0, -2.0], dtype=dtype) for _ in range(2)]
    avgs, residuals = _sparse_average("topk", xs, 1, device)
    for avg in avgs:
        assert torch.isfinite(avg).all(), avg
        assert avg[0] == torch.tensor(big, dtype=dtype)
    assert all(torch.equal(r, torch.tensor([0.0, 1.0, 0.0, -2.0], dtype=dtype))
               for r in residuals)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_powersgd_plan_of_a_16_bit_bucket_goes_dense_where_its_fp32_wire_is_larger(dtype):
    """PowerSGD sums P, Q and the uncompressed tensors in fp32 (acc_dtype): for a 16-bit
    bucket that is mostly 1-D tensors its wire is larger than the bucket itself, and the plan
    (and so the hook) still compressed, sending more bytes than a dense allreduce, and
    losing precision too. A plan goes dense where the compressed form is no smaller
    (BucketPlan), as int8's does."""
    shapes, numel = ((17, 17), (1000,)), 17 * 17 + 1000
    m = catalogue.get("powersgd")
    got = m.plan(numel, 4, dtype, shapes=shapes)
    assert got.dense and got.sent == numel * dtype.itemsize
    # where compressing does pay, it still compresses: fp32, and a 16-bit bucket of matrices
    assert not m.plan(numel, 4, torch.float32, shapes=shapes).dense
    wide = m.plan(64 * 64, 4, dtype, shapes=((64, 64),))
    assert not wide.dense and wide.sent < 64 * 64 * dtype.itemsize


def _call(name: str, density: float = 0.01, **kw) -> AggregationCall:
    """One aggregation of ``name`` over the default group, as a hook makes it."""
    m = catalogue.get(name)
    comp = m.make_compressor(density)
    ef = ErrorFeedback(comp) if m.error_feedback and comp is not None else None
    return AggregationCall(m, Comm(None, None, transport=m.path.on_transport), comp, ef,
                           density, False, name, **kw)


@pytest.mark.parametrize(("name", "dtype"), [("fp16", torch.bfloat16), ("fp16", torch.float16),
                                             ("bf16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_cast_to_a_16_bit_wire_of_a_16_bit_bucket_goes_dense(one_rank, name, dtype):
    """fp16 and bf16 halve an fp32 bucket; a 16-bit bucket they cast to a wire just as large,
    and the plan still called that compression: fp16 of a bf16 bucket turned every value
    above 65504 into inf, bf16 of an fp16 bucket dropped 3 bits of each mantissa, for no byte
    saved. The bucket as it is goes dense instead."""
    plan_ = catalogue.get(name).plan(10, 4, dtype)
    assert plan_.dense and plan_.sent == 10 * dtype.itemsize
    x = torch.tensor([70000.0 if dtype == torch.bfloat16 else 1000.5, 1.0], dtype=dtype)
    want = x.clone()
    c = _call(name)
    assert catalogue.issuer(c, x, 0) is catalogue.paths.DENSE
    got = catalogue.start(c, x, 0).result()
    assert torch.equal(got, want)  # world 1: the average is the gradient, bit for bit


def test_densities_that_differ_past_six_digits_make_different_headers(one_rank):
    """The call header wrote the density to 6 significant digits, so ranks whose densities
    differed further (and so whose k differed on a large bucket: 0.001 and 0.0010000004 of
    10⁹ elements are 1 000 000 and 1 000 001 entries) agreed, and then exchanged lists of
    different lengths. Now the header carries the density exactly."""
    a, b = (encode(methods.header(_call("topk", d), 10**9, torch.float32))
            for d in (0.001, 0.0010000004))
    assert not torch.equal(a, b)
    assert torch.equal(a, encode(methods.header(_call("topk", 0.001), 10**9, torch.float32)))
