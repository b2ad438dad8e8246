"""A dense call of a method whose NaN/Inf status travels with its data (top-k, gTop-k, int8,
PowerSGD: the warm-up's dense steps, a bucket no compression makes smaller) keeps the residual
where x + e would overflow, and applies nothing non-finite (gradwire.catalogue.paths,
gradwire.compress.feedback): a property on one rank in this process, on the host path and on
the device path (gradwire.syncfree.device_paths)."""

import contextlib

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwire import catalogue
from gradwire.catalogue import AggregationCall
from gradwire.compress import ErrorFeedback
from gradwire.hooks.comm import Comm
from gradwire.syncfree import device_paths

ONE_RANK = settings(max_examples=25, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# the methods whose NaN/Inf status travels with their data: no header status before a call
IN_BAND = ("topk", "gtopk", "int8", "powersgd")


def _call(name: str, dense: bool) -> AggregationCall:
    m = catalogue.get(name)
    comp = m.make_compressor(0.01)
    return AggregationCall(m, Comm(None, None, transport=m.path.on_transport), comp,
                           ErrorFeedback(comp), 0.01, dense, name)


# --- a dense call of an in-band method whose gradient + residual overflows -----------------

@ONE_RANK
@given(name=st.sampled_from(IN_BAND),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       device=st.booleans(), issued=st.booleans(),
       share=st.floats(0.55, 0.95), n=st.integers(2000, 3000), seed=st.integers(0, 2**16))
def test_a_dense_call_keeps_a_residual_that_would_overflow_with_the_gradient(
        one_rank, name, dtype, device, issued, share, n, seed):
    """A call that goes dense without a status (the warm-up's dense steps; a bucket that no
    compression makes smaller) of a method whose status travels with its data (top-k, gTop-k,
    int8, PowerSGD) flushed x + e as it was: where that overflowed x's dtype, every rank applied
    inf, made of finite values, and the residual was zeroed, its mass lost. As the NaN/Inf
    policy's dense path does, the rank now sums x alone there and keeps e:
    e_after + applied = e_before + x, and nothing non-finite is applied or kept (world 1: the
    average is what this rank sums)."""
    top = torch.finfo(dtype).max
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g, dtype=torch.float64) * share * top).to(dtype)
    e = (torch.rand(n, generator=g, dtype=torch.float64) * share * top).to(dtype)
    c = _call(name, dense=True)
    c.ef.residuals[0] = e.clone()  # as a residual kept from compressed steps
    with device_paths() if device else contextlib.nullcontext():
        path = catalogue.issuer(c, x, 0) if issued else None
        assert path is None or path is catalogue.paths.DENSE
        if path is not None:
            applied = path.issue(c, x.clone(), 0).wait(c)[0]
        else:
            applied = catalogue.start(c, x.clone(), 0, check=False).result()
    left = c.ef.residuals[0]
    assert torch.isfinite(applied).all() and torch.isfinite(left).all()
    # where x + e fits, it is applied (rounded as a dense sum rounds it); where it does not,
    # x alone is, and e kept: nothing lost either way
    want = x.double() + e.double()
    torch.testing.assert_close(applied.double() + left.double(), want,
                               rtol=2 * torch.finfo(dtype).eps, atol=0)
