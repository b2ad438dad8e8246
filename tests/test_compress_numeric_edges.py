"""Quantizers and their aggregation at the ends of a dtype's range: the gathered average of
finite payloads near the largest value, and QSGD on buckets whose unit norm/s is subnormal."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire import catalogue
from gradwire.compress import get
from gradwire.compress.quantize import QSGD
from gradwire.errors import GradwireError

# --- combine: scaled before it sums ----------------------------------------------------------


@pytest.mark.parametrize("name", ["qsgd", "efsignsgd", "terngrad", "int8", "powersgd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("world", [2, 3])
def test_the_average_of_finite_payloads_near_the_largest_value_is_finite(name, dtype, world):
    """``combine`` summed every rank's decompressed values, then divided by P: P finite
    values near the dtype's largest (3.4e38 in fp32, 3.39e38 in bf16, 1.8e308 in fp64) summed
    to inf, and the gathered path (qsgd, efsignsgd, terngrad, dgc) applied inf where every
    rank's gradient, and their average, is finite. Each is now scaled by 1/P before it is
    summed, as a dense allreduce does."""
    top = torch.finfo(dtype).max
    x = torch.full((6,), top, dtype=dtype)
    x[1::2] = -top
    c = get(name)
    payloads = [c.compress(x.clone()) for _ in range(world)]
    avg = c.combine(payloads, 6)
    assert avg.dtype == dtype and torch.isfinite(avg).all(), avg
    assert (avg.double() * x.double() > 0).all()  # the signs of the gradient
    # a quarter of each (exact) summed: no sum of fp64 values near its largest overflows
    quarter = sum(c.decompress(p, 6).double() / 4 for p in payloads) / world
    assert torch.allclose(avg.double() / 4, quarter, rtol=1e-2, atol=0)


# --- QSGD: a subnormal unit ------------------------------------------------------------------


@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
       s=st.sampled_from([1, 4, 255, 1000, 2**24]))
def test_qsgd_of_a_bucket_whose_unit_is_subnormal_is_unbiased(data, dtype, s):
    """Below a norm of s times the smallest normal, norm/s is subnormal: rounded to few bits
    it fell to 0 (a bucket of 7 · 2^-149 came back as zeros, whatever the draws) or below
    norm/s, and the largest elements' levels were clipped at s (319 · 2^-149 at s = 255
    always came back as 255 · 2^-149). Unbiased, the mean of many draws is x."""
    fin = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32)
    sub = fin.tiny * fin.eps  # the smallest subnormal of the accumulation dtype
    low = 1 if dtype != torch.bfloat16 else 2**16  # bf16's smallest subnormal is 2^-133
    # |k| < 256: k subnormal steps are exact in bf16 too (8 bits)
    ks = data.draw(st.lists(st.integers(-255, 255).map(lambda k: k * low), min_size=1,
                            max_size=4))
    x = (torch.tensor(ks, dtype=torch.float64) * sub).to(dtype)
    assert torch.equal(x.double(), torch.tensor(ks, dtype=torch.float64) * sub)  # exact
    q = QSGD(s=s, seed=5)
    draws = 200
    out = torch.stack([q.decompress(q.compress(x), x.numel()).double() for _ in range(draws)])
    assert torch.isfinite(out).all()
    norm = float(torch.linalg.vector_norm(x.double() / sub)) * sub
    # each draw lies within one unit (about norm/s, here at most a few subnormal steps more)
    # of x: the mean of 200 within 5 sd of it
    unit = norm / s + 8 * sub
    assert torch.allclose(out.mean(0), x.double(), rtol=0, atol=5 * unit / draws**0.5 + 1e-300)
    assert (out[:, x == 0] == 0).all()


@pytest.mark.parametrize(("k", "n"), [(7, 3), (319, 1)])
def test_qsgd_never_sends_a_tiny_fp32_bucket_as_zeros_or_clips_it(k, n):
    """The two cases of the property above, as they showed at s = 255: n elements of
    k · 2^-149, 7 (three of them) decoded to 0 at every draw; 319 (alone) to 255 · 2^-149 at
    every draw. The mean of 200 draws is now within a subnormal step or two of x."""
    x = torch.full((n,), k * 2.0**-149)
    q = QSGD(s=255, seed=1)
    out = torch.stack([q.decompress(q.compress(x), n) for _ in range(200)]).double()
    assert torch.allclose(out.mean(0), x.double(), rtol=0, atol=2 * 2.0**-149)


# --- the catalogue's plan: bad input is a one-line error ------------------------------------


@pytest.mark.parametrize(("method", "other"), [("powersgd", "qsgd"), ("qsgd", "signsgd"),
                                               ("int8", "qsgd"), ("topk", "qsgd"),
                                               ("dense", "qsgd")])
def test_a_plan_given_another_methods_compressor_is_a_one_line_error(method, other):
    """powersgd's plan failed a bare ``assert``; the others priced the wrong compressor
    (a qsgd plan given signsgd's: signsgd's wire) or ignored it (int8, topk, dense)."""
    with pytest.raises(GradwireError, match=f"(?i)^{method}: expected .*got {other}") as e:
        catalogue.get(method).plan(10_000, 2, compressor=get(other))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shapes", [[(3, "a")], "abc", [(-2, -3)], [(2.5, 4)], 5, [5]])
def test_a_powersgd_plan_of_malformed_shapes_is_a_one_line_error(shapes):
    """A string dimension raised a TypeError, shapes that are not sequences too; a negative
    or fractional one was planned wherever the product matched the bucket (6 and 10 here)."""
    numel = {str([(-2, -3)]): 6, str([(2.5, 4)]): 10}.get(str(shapes), 100)
    with pytest.raises(GradwireError, match="^powersgd: .*shape") as e:
        catalogue.get("powersgd").plan(numel, 2, shapes=shapes)
    assert "\n" not in str(e.value)


def test_an_int8_state_with_malformed_exponents_leaves_the_compressor_as_it_was():
    """The step was set before ``exponents`` was read: a state whose exponents are not a
    mapping raised with the step already loaded (PowerSGD's reads both first)."""
    c = get("int8")
    c.step = 3
    with pytest.raises(TypeError):
        c.load_state_dict({"step": 7, "exponents": 5})
    assert c.step == 3 and c.exponents == {}
