"""Numeric and input edges: gTop-k's 16-bit merges, sparse estimate's params, PowerSGD near a
dtype's largest value, the simulator's element size of a compressed bucket, and simulator
options built in Python."""

import pytest
import torch

from gradwire import catalogue
from gradwire.collectives.local import execute_local
from gradwire.compress.feedback import ErrorFeedback
from gradwire.compress.lowrank import PowerSGD, PowerSGDCompressor, layout
from gradwire.errors import GradwireError
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import CollectiveOptions, simulate_collective
from gradwire.sim.ps import PSOptions
from gradwire.sparse import estimate
from gradwire.sparse.allreduce import feed, plan
from gradwire.syncfree import device_paths

# --- gTop-k: 16-bit merges ------------------------------------------------------------------


def _gtopk(xs, k, algo, device):
    """Every rank's dense average (Plan.average), rank 0's dense total and every residual
    after gtopk, all in one process: the host path, or with ``device`` the sync-free one."""
    n, p = xs[0].numel(), len(xs)
    rs = [torch.zeros_like(x) for x in xs]
    with device_paths() if device else torch.no_grad():
        plans = [plan("gtopk", feed(x, r, k, "exact"), k, n, r, i, p, algo)
                 for i, (x, r) in enumerate(zip(xs, rs, strict=True))]
        execute_local(plans[0].schedule, [q.buffer for q in plans], [q.combine for q in plans])
        avgs = [q.average(torch.empty_like(xs[0])) for q in plans]
        return avgs, plans[0].finish().total(), rs


@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("algo", [None, "tree"])
@pytest.mark.parametrize("p", [3, 4, 6])
@pytest.mark.parametrize(("dtype", "big", "unit"), [(torch.float16, 30000.0, 2.0**-24),
                                                    (torch.bfloat16, 2.0**127, 2.0**-133)])
def test_gtopk_16_bit_merges_do_not_overflow_where_the_average_fits(dtype, big, unit, p, algo,
                                                                     device):
    """Every rank's ``big`` at index 0: their sum is past the dtype's largest value, their
    average is not (gTop-k's merges added in the dtype and gave inf; Top-k's sums are
    tests/test_codecs_near_dtype_max.py's). The rest are small multiples of the smallest
    subnormal, exact in any sum: what the ranks send and what the merges drop still add up
    to their inputs, bit for bit."""
    g = torch.Generator().manual_seed(p)
    xs = [torch.cat([torch.tensor([big]), torch.randint(-20, 21, (11,), generator=g) * unit])
          .to(dtype) for _ in range(p)]
    avgs, total, rs = _gtopk([x.clone() for x in xs], 4, algo, device)
    for avg in avgs:
        assert avg[0].item() == big and torch.isfinite(avg).all()
        assert torch.equal(avg, avgs[0])
    assert all(r[0] == 0 for r in rs)
    kept = torch.stack(rs).double().sum(0) + total.double()
    assert torch.equal(kept[1:], torch.stack(xs).double().sum(0)[1:])


# --- sparse estimate ------------------------------------------------------------------------

@pytest.mark.parametrize("params", [None, "1e9"])
def test_sparse_estimate_without_cost_params_is_a_one_line_error(params):
    with pytest.raises(GradwireError, match=r"^sparse estimate: params must be a CostParams "
                                            r".*got (None|'1e9')$"):
        estimate("gtopk", 4, 1000, 10, params)


# --- PowerSGD near the largest value --------------------------------------------------------

def _near_top(dtype: torch.dtype, count: int = 1) -> torch.Tensor:
    """``count`` 64×64 rank-1 matrices (fp32) with max |m| 0.9 of ``dtype``'s largest."""
    g = torch.Generator().manual_seed(3)
    u, v = (torch.rand(64, generator=g, dtype=torch.float64) * 2 - 1 for _ in range(2))
    m = torch.outer(u, v)
    m = (m / m.abs().max() * 0.9 * torch.finfo(dtype).max).float()
    return torch.stack([m if i % 2 == 0 else -m for i in range(count)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_powersgd_near_the_largest_value_is_finite_and_conserves_mass(dtype):
    """Q = Mᵀ·P reaches max|M|·√rows: past the largest fp32 (and bf16) value for a 64-row
    gradient at 0.9 of it, and the step applied inf or NaN. Error feedback keeps
    residual + applied = x + previous residual, up to the dtype's rounding."""
    x = _near_top(dtype).reshape(-1).to(dtype)
    top, eps = torch.finfo(dtype).max, torch.finfo(dtype).eps
    ef = ErrorFeedback(PowerSGDCompressor(rank=2))
    before = torch.zeros(x.numel(), dtype=torch.float64)
    for _ in range(3):
        payload = ef.compress("b", x)
        applied = ef.compressor.decompress(payload, x.numel())
        after = ef.residuals["b"]
        assert all(torch.isfinite(t).all() for t in payload.tensors())
        assert torch.isfinite(applied).all() and torch.isfinite(after).all()
        gap = after.double() + applied.double() - (x.double() + before)
        assert gap.abs().max() <= eps * top
        before = after.double()


def test_powersgd_steps_near_the_largest_fp32_value_stay_finite():
    """The steps as the hook runs them (P, Q, then P·Qᵀ written over the bucket)."""
    batch = _near_top(torch.float32, 2)
    b = layout(batch.numel(), [(64, 64), (64, 64)], 1).batches[0]
    ps = PowerSGD(rank=1)
    for _ in range(2):
        p = ps.p(batch, key="k")
        q = ps.q(batch, p, key="k")
        assert torch.isfinite(p).all() and torch.isfinite(q).all()
        out = torch.zeros(batch.numel())
        b.product_into(p, q, out)
        torch.testing.assert_close(out, batch.reshape(-1), rtol=1e-5, atol=0)


# --- the simulator's price of a compressed bucket -------------------------------------------

def _priced(t: tr.Trace, world: int) -> int:
    """Bytes over the workers' up links per iteration, one bucket of the whole trace, top-k."""
    o = CollectiveOptions("ring", bucket_bytes=t.total_bytes, compressor="topk",
                          compressor_params={"density": 0.01})
    c = SimCluster(world, 1e9, iterations=2)
    return round(simulate_collective(t, c, o).link_bytes["worker up"] / c.iterations)


def _sent(numel: int, world: int, dtype: torch.dtype) -> int:
    m = catalogue.get("topk")
    compressor, density = m.compressor_from({"density": 0.01})
    return int(m.plan(numel, world, dtype, compressor, density, "ring").bytes_sent(world).sum())


@pytest.mark.parametrize("world", [2, 5])
def test_a_compressed_bucket_counts_its_elements_by_their_size(world):
    """The trace's shapes give 2 bytes per element (an fp16 model): 10 000 fp16 elements,
    priced as 5 000 fp32 ones before (half the entries, each of fp32's 8 bytes)."""
    half = tr.synthetic("h", [2 * 6000, 2 * 4000], 0.01, 0.02, shapes=[(60, 100), (4000,)])
    assert _priced(half, world) == _sent(10_000, world, torch.float16)


@pytest.mark.parametrize("world", [2, 5])
def test_a_compressed_bucket_of_a_size_no_float_divides_drops_no_byte(world):
    """No shape, 4003 bytes: the fp32 elements that hold them (1001), not 4003 // 4."""
    odd = tr.synthetic("odd", [4003], 0.01, 0.02)
    assert _priced(odd, world) == _sent(1001, world, torch.float32)


# --- simulator options built in Python ------------------------------------------------------

@pytest.mark.parametrize(("make", "match"), [
    (lambda: PSOptions(barrier="off"), r"^barrier must be True or False, got 'off'$"),
    (lambda: PSOptions(multicast=1), r"^multicast must be True or False, got 1$"),
    (lambda: PSOptions(ina=None), r"^ina must be True or False, got None$"),
    (lambda: CollectiveOptions("ring", bucket_bytes="1000"),
     r"^bucket_bytes must be bytes >= 0 .*got '1000'$"),
    (lambda: CollectiveOptions("ring", bucket_bytes=-1), r"^bucket_bytes must be bytes >= 0"),
    (lambda: CollectiveOptions("nope"), r"^unknown allreduce algorithm 'nope'"),
    (lambda: CollectiveOptions("ring", params={"pipeline": "x"}), r"pipeline='x'"),
    (lambda: CollectiveOptions("ring", params={"itemsize": 2}), r"'itemsize' is not taken"),
    (lambda: CollectiveOptions("ring", compressor=3), r"^unknown compressor 3: expected"),
    (lambda: CollectiveOptions("ring", compressor="topk", compressor_params={"density": "0.1"}),
     r"^topk: density must be"),
    (lambda: CollectiveOptions("ring", compressor="topk", params={"pipeline": 2}),
     r"^params \(the dense allreduce's\) are not taken with compressor 'topk'"),
    (lambda: CollectiveOptions("ring", compressor_params=None), r"^compressor_params must be"),
    (lambda: CollectiveOptions("ring", multicast="yes"), r"^multicast must be True or False"),
    (lambda: CollectiveOptions("rd", multicast=True), r"^multicast runs ring\+multicast"),
])
def test_simulator_options_built_in_python_are_checked_when_made(make, match):
    with pytest.raises(GradwireError, match=match) as caught:
        make()
    assert "\n" not in str(caught.value)
