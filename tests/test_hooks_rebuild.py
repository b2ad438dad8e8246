"""Error feedback conserves gradient mass where DDP rebuilds its buckets: after the first step
DDP cuts the one bucket of step 0 into one per parameter or two, and buckets too small to
compress take the dense path. Measured from the parameters' gradients (what was applied), not
from the hook's own bookkeeping: over the steps, Σ ranks residual + Σ steps P·applied equals
Σ steps Σ ranks injected gradient.

The layout of step 0's bucket disappears in the rebuild: a residual left under it and handed
over again would show as mass made at every step, and its key must be gone at the end (no
parameter's residual under two layouts)."""

import warnings

import pytest
import torch
from conftest import run_world

EF_METHODS = ("topk", "gtopk", "randomk", "dgc", "efsignsgd", "int8", "powersgd")
STEPS = 6
POISON_STEP = 1  # the first step after the rebuild
# poison "nan": step -> the parameter whose gradient holds a NaN on the last rank: the smallest
# (too small to compress: its bucket goes dense) right after the rebuild, then the largest in
# steady state (compressed; int8 issues it from the hook, and falls back from there)
NAN_AT = {POISON_STEP: -1, 4: 0}
SHAPES = ((7, 5), (5,), (3, 2), (2,), (1,))  # five small parameters, as the report's model
# "overflow": a sixth parameter in fp16 whose gradients are multiples of 32 (so its sums are
# exact up to 65504); on the last rank it is V everywhere at steps 1 and 2, so what step 1
# left of V in a residual overflows fp16 with step 2's V (V + V/2 > 65504: PowerSGD's
# residual at P = 2; 6 × 6 is large enough for PowerSGD not to send it dense).
HALF_SHAPE, V = (6, 6), 44000.0
# EF-signSGD's scale (a mean), int8's levels times their scale and PowerSGD's product round
# in fp16: for them the fp16
# parameter's gap is held to fp16 rounding, 4 units in the last place at 6·10⁴ (measured 21
# and 37; V lost or made would be 10⁴ or more), not to 0; an Inf anywhere is a gap of inf.
ROUNDS_FP16 = {"efsignsgd": 128.0, "int8": 128.0, "powersgd": 128.0}


def _rank(rank: int, world: int, poison: str | None) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import gradwire.hooks as gh

    torch.set_num_threads(1)
    shapes = [(s, torch.float64) for s in SHAPES]
    if poison == "overflow":
        shapes.append((HALF_SHAPE, torch.float16))
    last = rank == world - 1
    report = {}
    for name in EF_METHODS:
        torch.manual_seed(0)
        params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(s, dtype=dt)) for s, dt in shapes])
        module = torch.nn.Module()
        module.params = params
        ddp = DistributedDataParallel(module, bucket_cap_mb=1e-5)
        opts = {"rank": 1} if name == "powersgd" else {}
        # 0.2: low enough that dgc still compresses the fp16 parameter (0.3 sent it dense)
        state = gh.make(name, density=0.2, warmup=False, **opts)
        state.register(ddp)
        injected = [torch.zeros(s, dtype=torch.float64) for s, _ in shapes]
        applied = [torch.zeros(s, dtype=torch.float64) for s, _ in shapes]
        g = torch.Generator().manual_seed(100 + rank)
        cleared, overflows = True, 0
        for step in range(STEPS):
            grads = [torch.randint(-9, 10, s, generator=g).to(dt) for s, dt in shapes]
            if poison == "overflow":
                grads[-1] *= 32
                if last and step in (POISON_STEP, POISON_STEP + 1):
                    grads[-1].fill_(V)
            nan = NAN_AT.get(step) if poison == "nan" else None
            if nan is not None and last:
                grads[nan].view(-1)[0] = float("nan")
            for p in params:
                p.grad = None
            loss = sum((p * c).sum() for p, c in zip(params, grads, strict=True))
            # DDP hooks run on backward of the module's output: route through forward
            ddp.module.forward = lambda: loss  # noqa: B023
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ddp().backward()
            overflows += sum("overflows float16" in str(w.message) for w in caught)
            if nan is not None:  # its residual is cleared everywhere
                pos = state.positions.position(params[nan])
                cleared &= bool((state.state_dict()["residuals"].get(
                    pos, torch.zeros(1, dtype=torch.float64)) == 0).all())
                injected[nan].zero_()  # its mass starts afresh after the NaN step
                applied[nan].zero_()
                grads[nan].zero_()
                params[nan].grad.zero_()
            for acc, c in zip(injected, grads, strict=True):
                acc += c.double()
            for acc, p in zip(applied, params, strict=True):
                acc += p.grad.double() * world  # the average, times P: what all ranks applied
        residual = state.state_dict()["residuals"]
        gaps = []
        for i, p in enumerate(params):
            inj = injected[i].clone()
            dist.all_reduce(inj)
            pos = state.positions.position(p)
            res = residual.get(pos, torch.zeros(p.numel(), dtype=torch.float64))
            res = res.reshape(p.shape).double()
            dist.all_reduce(res)
            gaps.append(float((res + applied[i] - inj).abs().max()))
        layouts = list(state.ef.residuals)
        disjoint = len({pos for key in layouts for pos in key}) == sum(map(len, layouts))
        report[name] = {"gaps": gaps, "cleared": cleared, "disjoint": disjoint,
                        "overflows": overflows, "issued": state.stats["issued"],
                        "buckets": state.stats["buckets"]}
    return report


@pytest.mark.parametrize(("world", "poison"), [(2, "overflow"), (3, None), (6, None),
                                               (3, "nan")])
def test_error_feedback_conserves_mass_across_the_bucket_rebuild(world, poison, tmp_path):
    """poison "nan": at step 1, and again at step 4, the last rank's gradient of one parameter
    holds a NaN (NAN_AT); its residual must be cleared on every rank then, and mass is
    conserved from there on, and for every other parameter throughout. "overflow": the last
    rank's fp16 gradient plus its residual overflows at step 2; every rank aggregates that
    bucket dense without the residuals, which stay finite, and mass is conserved
    throughout."""
    report = run_world(_rank, world, tmp_path, poison)[0]  # rank 0 (gaps: of all ranks)
    for name, r in report.items():
        tol = [1e-9] * len(SHAPES) + [ROUNDS_FP16.get(name, 0.0)]
        assert all(gap <= t for gap, t in zip(r["gaps"], tol, strict=False)), (name, r)
        assert r["cleared"] and r["disjoint"], (name, r)
    # int8 in steady state is issued from the hook (the NaN step's fallback included)
    # int8 is issued from the hook once every bucket has its step sizes (step 2 on; step 3
    # where the NaN of step 1 kept its bucket's first step from setting them): steps 3, 4 (the
    # steady-state NaN's, whose bucket falls back from there) and 5 at least
    int8 = report["int8"]
    per_step = (int8["buckets"] - 1) // (STEPS - 1)  # step 0 has one bucket
    assert int8["issued"] >= (STEPS - 3) * per_step, int8
    if poison == "overflow":  # the case happened: V stays in a residual, except EF-signSGD's
        made = {name for name, r in report.items() if r["overflows"]}
        assert made >= {"topk", "gtopk", "randomk", "dgc", "powersgd"}, report
