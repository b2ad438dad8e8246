"""Edges of the catalogue's paths with several ranks (each a thread of this process, summing
through a barrier): 16-bit casts and int8 at the largest values of the bucket's dtype, int8
on fp64 gradients outside fp32's range, and plans of methods whose density changes from call
to call (a density warm-up)."""

import contextlib
import threading

import pytest
import torch

from gradwire import catalogue
from gradwire.catalogue import AggregationCall, methods
from gradwire.compress import ErrorFeedback
from gradwire.hooks.comm import Comm
from gradwire.syncfree import device_paths


class _Ranks:
    """What the ranks of one world share: a barrier and a slot each."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * world


class _ThreadComm:
    """A rank's side of :class:`_Ranks`: allreduce sums every rank's tensor, in its dtype, in
    rank order (as a ring would give it bit for bit on every rank)."""

    algo = None
    group = None
    agreed = None

    def __init__(self, ranks: _Ranks, rank: int) -> None:
        self.ranks, self.rank, self.world, self.seconds = ranks, rank, ranks.world, 0.0

    def all_reduce(self, t: torch.Tensor) -> None:
        self.wait(self.all_reduce_start(t))

    def all_reduce_start(self, t: torch.Tensor) -> list:
        r = self.ranks
        r.slots[self.rank] = t.clone()
        r.barrier.wait()
        total = r.slots[0].clone()
        for s in r.slots[1:]:
            total += s
        r.barrier.wait()  # every rank has read the slots before any writes the next
        t.copy_(total)
        return []

    def wait(self, flying: list) -> None:
        pass

    def agree(self, call, status=0):  # the header exchange is the hooks' (off here)
        return None


def _average(name: str, xs: list[torch.Tensor], steps: int = 1, device: bool = False
             ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """(rank 0's average at each step, each rank's residual after the last) of ``steps``
    aggregations of ``xs`` (one gradient per rank, the same every step) by ``name``."""
    ranks = _Ranks(len(xs))
    got: list = [None] * len(xs)
    errors: list[BaseException] = []
    m = catalogue.get(name)

    def rank(r: int) -> None:
        try:
            comp = m.make_compressor(0.01)
            ef = ErrorFeedback(comp) if m.error_feedback else None
            c = AggregationCall(m, _ThreadComm(ranks, r), comp, ef, 0.01, False, name)
            with device_paths() if device else contextlib.nullcontext():
                avgs = [catalogue.start(c, xs[r].clone(), "b", check=False).result().clone()
                        for _ in range(steps)]
            got[r] = (avgs, None if ef is None else ef.residuals["b"].clone())
        except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(e)
            ranks.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for avgs, _ in got[1:]:  # every rank takes the same average
        assert all(torch.equal(a, b) for a, b in zip(avgs, got[0][0], strict=True))
    return got[0][0], [e for _, e in got]


# --- fp16 and bf16: scaled before the cast ----------------------------------------------------

@pytest.mark.parametrize(("name", "big"), [("fp16", 90000.0), ("bf16", 3.4e38)])
def test_a_cast_scales_the_gradient_before_rounding_it_to_the_wire(name, big):
    """The cast came first and the 1/P after it: an fp32 gradient past the wire's range
    (fp16's 65504; bf16's 3.39e38, below fp32's largest) became inf before it was scaled,
    and every rank applied inf where the average (45000, 1.7e38) is finite in the wire's
    dtype. Scaled first, in fp32, it is rounded once to the wire, as a dense average is."""
    xs = [torch.tensor([big, 1.0, -3.0]), torch.tensor([0.0, 1.0, 1.0])]
    (avg,), _ = _average(name, xs)
    want = (xs[0] + xs[1]) / 2
    assert torch.isfinite(avg).all(), avg
    assert torch.allclose(avg, want, rtol=1e-2, atol=0), (avg, want)


# --- int8: levels never past the dtype's largest value ----------------------------------------

# from the second step x + e overflows (e holds what the capped levels left): the NaN/Inf
# policy sums that bucket dense, warning
@pytest.mark.filterwarnings("ignore:gradwire hook int8:RuntimeWarning")
@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize(("dtype", "world"), [(torch.float16, 2), (torch.float16, 4),
                                              (torch.float32, 1), (torch.float32, 2)])
def test_int8_average_of_a_bucket_at_its_largest_values_is_finite(dtype, world, device):
    """A level rounded up past the dtype's largest value (round(65504/1448) = 45 steps of
    1448 = 65160, but 63712/… and 65504 on other step sizes rounded to 65536): the average
    of finite gradients came out inf (fp16's 65504 at P = 2 or 4, fp32's 3.4e38 at any P),
    and the residual of that rank −inf in fp32. Each block's levels are capped where a
    step·level would pass the largest value; error feedback keeps the rest."""
    top = torch.finfo(dtype).max
    x = torch.full((1500,), top, dtype=dtype)  # a short second block as well
    x[::2] = -top
    avgs, residuals = _average("int8", [x] * world, steps=3, device=device)
    for step, avg in enumerate(avgs):
        assert torch.isfinite(avg).all(), (step, avg)
        assert (avg * x >= 0).all()  # the signs of the gradient
    assert all(torch.isfinite(e).all() for e in residuals)
    # nothing lost: what the ranks keep and what they applied is what they had, 3 times
    # (up to the rounding of the average to the bucket's dtype)
    kept = sum(e.double() for e in residuals) + world * sum(a.double() for a in avgs)
    rtol = 1e-3 if dtype == torch.float16 else 1e-6
    assert torch.allclose(kept, 3 * world * x.double(), rtol=rtol, atol=0)


@pytest.mark.parametrize("value", [1e-45, 1e-200, 1e45, 1e200])
def test_int8_sends_fp64_gradients_outside_fp32s_range(value):
    """The step sizes of an fp64 bucket are fp64, but their exponents were held within fp32's
    (2^±126): gradients below about 1e-38 were rounded to no level at all (nothing applied,
    step after step: the residual kept it all), and those above about 1e40 were clipped to
    127 steps of 2^126 (1e45 applied as 5e39). Within fp64's own range they go through."""
    xs = [torch.full((1500,), value, dtype=torch.float64) for _ in range(2)]
    xs[1][::3] = -value / 2
    want = (xs[0] + xs[1]) / 2
    avgs, _ = _average("int8", xs, steps=3)
    for avg in avgs:  # within a few steps of the block's largest value (int8 at P = 2)
        assert torch.allclose(avg, want, rtol=0, atol=0.05 * value), (avg[:4], want[:4])


# --- plans at the call's density ---------------------------------------------------------

@pytest.mark.parametrize(("name", "high", "low"), [("dgc", 0.6, 0.01), ("randomk", 0.9, 0.01)])
def test_a_plan_takes_the_calls_density_not_the_compressors_last(name, high, low):
    """dgc's and random-k's plans read the density from the compressor, which holds the one
    its last call set: under a density warm-up the plan priced another k than the call sent
    (random-k: 40 bytes planned for 3600 sent), and dgc, once a high density had sent a
    bucket dense, planned dense at every later density, so it never compressed again."""
    m = catalogue.get(name)
    for made, asked in ((low, high), (high, low)):
        comp = m.make_compressor(made)
        got = m.plan(1000, 4, torch.float32, comp, asked)
        assert got == m.plan(1000, 4, torch.float32, m.make_compressor(asked), asked)
        assert comp.density == made  # asking changes nothing


def test_dgc_compresses_again_after_a_dense_step_of_its_warm_up(one_rank):
    """The hook's path: one compressor, calls at the warm-up's densities in turn. At 0.6 the
    bucket goes dense (its entries would be larger); at 0.01 it must be compressed."""
    m = catalogue.get("dgc")
    comp = m.make_compressor(0.01)  # as the hook makes it: at the density after the warm-up
    c = AggregationCall(m, Comm(None, None, transport=False), comp, ErrorFeedback(comp), 0.6,
                        False, "dgc")
    sent = []
    for density in (0.6, 0.01, 0.01):
        c.density = density
        plan = m.plan(1000, 1, torch.float32, comp, density)
        assert methods._sent_dense(c, 1000, torch.float32) is plan.dense
        sent.append((catalogue.start(c, torch.randn(1000), "b").sent, plan.sent, plan.dense))
    assert sent[0] == (4000, 4000, True)
    assert sent[1] == sent[2] == (8 * 13 + 4, 8 * 13 + 4, False)  # ⌈1.25·10⌉ entries
