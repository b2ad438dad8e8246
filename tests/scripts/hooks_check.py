"""gradwire.hooks under DDP on gloo: exactness against DDP without a hook, every method in both
modes, conservation of gradient mass under error feedback (across DDP's bucket rebuild),
checkpoint round trips, and which methods issue their allreduces from the hook in steady
state. Prints one FAIL line per problem and a final CHECKED line.

DDP builds one bucket in iteration 0 and rebuilds after it; a 104-byte bucket cap gives one
bucket per layer from iteration 1 on, so every run below goes through a rebuild. The model
and data live on checklist.DEV (the GPU under NCCL).
"""
import copy
import math
import warnings

import torch
import torch.distributed as dist
from checklist import DEV, check, done, init
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.compress.base import select_count
from gradwire.schedules.cost import traffic
from gradwire.sparse import entry_bytes, schedule

rank, p = init()
SMALL_BUCKETS, ONE_BUCKET = 0.0001, 25
STEPS = 3
EF = {"topk", "gtopk", "randomk", "dgc", "efsignsgd", "int8", "powersgd"}
# Most nonzeros the average may have for k per rank: gTop-k's is the global top-k.
SPARSE_BOUND = {"gtopk": lambda k: k, "topk": lambda k: p * k, "randomk": lambda k: k,
                "dgc": lambda k: p * math.ceil(1.25 * k)}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 8), nn.Tanh(),
                         nn.Linear(8, 3)).double().to(DEV)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(5, 6, generator=g, dtype=torch.float64).to(DEV),
            torch.randn(5, 3, generator=g, dtype=torch.float64).to(DEV))


class Run:
    """A DDP model with an optional hook state, an SGD optimizer, and a step counter."""

    def __init__(self, state: gh.HookState | None, cap: float = SMALL_BUCKETS,
                 start: dict | None = None, momentum: float = 0.9) -> None:
        self.net = model()
        if start is not None:
            self.net.load_state_dict(start["model"])
        self.ddp = DDP(self.net, bucket_cap_mb=cap)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=momentum)
        if start is not None:
            self.opt.load_state_dict(start["opt"])
        self.state = state
        if state is not None:
            if start is not None:
                state.load_state_dict(start["hook"])
            state.register(self.ddp)
        self.step = start["step"] if start is not None else 0

    def loss(self, net: nn.Module) -> torch.Tensor:
        x, y = batch(self.step)
        return ((net(x) - y) ** 2).mean()

    def backward(self) -> None:
        self.opt.zero_grad()
        self.loss(self.ddp).backward()

    def advance(self) -> None:
        self.opt.step()
        self.step += 1

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.backward()
            self.advance()

    def params(self) -> torch.Tensor:
        return torch.cat([q.detach().reshape(-1) for q in self.net.parameters()])

    def checkpoint(self) -> dict:
        return copy.deepcopy({"model": self.net.state_dict(), "opt": self.opt.state_dict(),
                              "hook": self.state.state_dict(), "step": self.step})


def same(a: torch.Tensor, b: torch.Tensor, what: str, exact: bool = True,
         atol: float = 0.0) -> None:
    ok = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=0, atol=atol)
    check(ok, f"{what}: max difference {(a - b).abs().max().item():.3g}")


reference = Run(None)
reference.train(STEPS)
want = reference.params()

# (a) dense == DDP without a hook, bit for bit (bucket mode: the same allreduces; model mode:
# one allreduce of everything, whose ring chunks sum in another order for P > 2).
for overlap in (True, False):
    for mode in gh.MODES:
        r = Run(gh.make("dense", mode=mode, overlap=overlap))
        r.train(STEPS)
        same(r.params(), want, f"dense mode={mode} overlap={overlap}",
             exact=mode == "bucket" or p <= 2, atol=1e-12)
r = Run(gh.make("dense", algo="ring"))
r.train(STEPS)
same(r.params(), want, "dense over gradwire's ring", exact=False, atol=1e-12)

# (b) the sparsifiers at density 1.0 drop nothing: exactly DDP.
for m in ("topk", "gtopk", "randomk", "dgc"):
    r = Run(gh.make(m, density=1.0, warmup=False))
    r.train(STEPS)
    same(r.params(), want, f"{m} at density 1.0")

# (c) fp16 and bf16 within their precision.
for m, tol in (("fp16", 1e-3), ("bf16", 1e-2)):
    r = Run(gh.make(m))
    r.train(STEPS)
    same(r.params(), want, m, exact=False, atol=tol)


# (d, e) every method in both modes; error feedback conserves mass across the rebuild.
def by_position(state: gh.HookState, tensors: dict[int, torch.Tensor]) -> torch.Tensor:
    """A vector in the net's parameter order from tensors keyed by hook position."""
    return torch.cat([tensors.get(state.positions.position(q), torch.zeros(q.numel(),
                      dtype=q.dtype, device=q.device)).reshape(-1) for q in net_params])


for m in gh.METHODS:
    for mode in gh.MODES:
        tag = f"{m} mode={mode}"
        state = gh.make(m, density=0.1, mode=mode, warmup=False, rank=2) if m == "powersgd" \
            else gh.make(m, density=0.1, mode=mode, warmup=False)
        r = Run(state)
        net_params = list(r.net.parameters())
        buckets = []
        for step in range(STEPS):
            before = state.state_dict()["residuals"]
            local = torch.autograd.grad(r.loss(r.net), net_params)  # no DDP: this rank's grad
            seen = state.stats["buckets"]
            try:
                r.backward()
            except Exception as e:  # reported, then the next method
                check(False, f"{tag} step {step}: {type(e).__name__}: {e}")
                break
            buckets.append(state.stats["buckets"] - seen)
            applied = torch.cat([q.grad.reshape(-1) for q in net_params])
            check(bool(torch.isfinite(applied).all()), f"{tag} step {step}: non-finite grads")
            if mode == "model" and m in SPARSE_BOUND:  # one selection over the whole model
                nnz, k = int((applied != 0).sum()), math.ceil(0.1 * applied.numel())
                check(0 < nnz <= SPARSE_BOUND[m](k), f"{tag} step {step}: {nnz} nonzeros, k={k}")
            if m == "signsgd":
                check(set(applied.unique().tolist()) <= {-1.0, 0.0, 1.0}, f"{tag}: not a vote")
            if m in EF:
                after = state.state_dict()["residuals"]
                g = torch.cat([t.reshape(-1) for t in local])
                lhs = by_position(state, after) + applied  # summed over ranks: + P·applied
                rhs = by_position(state, before) + g
                dist.all_reduce(lhs)
                dist.all_reduce(rhs)
                same(lhs, rhs, f"{tag} step {step}: residual mass", exact=False, atol=1e-9)
            r.advance()
        if mode == "bucket" and len(buckets) == STEPS:
            check(buckets[0] == 1 and buckets[1] > 1,
                  f"{tag}: expected 1 bucket in iteration 0 then a rebuild, got {buckets}")
        if m == "int8" and buckets:  # the scratch of the buckets before the rebuild is freed
            kept = len(state.compressor.buffers)
            check(kept == buckets[-1], f"{tag}: scratch for {kept} buckets, {buckets[-1]} in use")
            kept = len(state.compressor.exponents)
            check(kept == buckets[-1], f"{tag}: step sizes of {kept} buckets, {buckets[-1]} in use")
        check(state.stats["steps"] == len(buckets) and state.stats["sent"] > 0,
              f"{tag}: stats {state.stats}")


# (f) a checkpoint taken between iterations resumes identically.
def round_trip(m: str, mode: str, cap: float, **extra: float) -> None:
    """Model mode aggregates in parameter-position order, so the resumed run computes the
    same sums. In bucket mode the resumed DDP's first iteration has its initial bucket (another
    parameter order), so only methods that do not care about order match, up to rounding."""
    kw = {"density": 0.1, "mode": mode, "warmup": [0.3, 0.2], "steps_per_epoch": 1000, **extra}
    a = Run(gh.make(m, **kw), cap)
    a.train(1)
    a.state.set_epoch(1)  # the checkpoint must carry the warm-up position
    a.train(1)
    saved = a.checkpoint()
    a.train(2)
    b = Run(gh.make(m, **kw), cap, start=saved)
    b.train(2)
    same(b.params(), a.params(), f"{m} mode={mode} {extra} resumed from a checkpoint",
         exact=mode == "model", atol=1e-12)


for m in sorted(EF) + ["qsgd", "terngrad"]:
    round_trip(m, "model", SMALL_BUCKETS)
for m in ("topk", "efsignsgd"):
    round_trip(m, "bucket", ONE_BUCKET)
for m in ("gtopk", "powersgd"):  # the velocities are in the checkpoint too
    round_trip(m, "model", SMALL_BUCKETS, momentum=0.9)


# (g) gradwire's collectives and the in-hook path give what torch's and the thread give.
for m, mode, exact in (("qsgd", "bucket", True), ("dgc", "model", True),
                       ("powersgd", "bucket", False)):
    results = []
    for kw in ({}, {"algo": "ring"}, {"overlap": False}):
        r = Run(gh.make(m, density=0.1, mode=mode, **kw))
        r.train(STEPS)
        results.append(r.params())
    same(results[1], results[0], f"{m} mode={mode} over gradwire's ring", exact, atol=1e-12)
    same(results[2], results[0], f"{m} mode={mode} without the comm thread")

# (h) the density asked for is what goes on the wire from the first step (no warm-up unless
# asked for): one bucket of gTop-k at density 0.01 moves exactly its schedule's bytes for k.
state = gh.make("gtopk", density=0.01, mode="model")
r = Run(state, cap=ONE_BUCKET)
r.backward()
n = sum(q.numel() for q in r.net.parameters())
k = select_count(n, 0.01, None)
wire = traffic(schedule("gtopk", p, n, k, torch.float64), 1)
check(state.density == 0.01 and state.stats["sent"] == k * entry_bytes(n, torch.float64),
      f"density from step one: {state.density}, sent {state.stats['sent']} for k = {k}")
got = state._comm.agreed.bytes_sent  # noqa: SLF001 - what the transport counted
check(got == wire.bytes_sent[rank].tolist(), f"density from step one: the transport sent {got},"
      f" the schedule of k = {k} says {wire.bytes_sent[rank].tolist()}")

# (i) once a step has agreed on its buckets (the third: the first, DDP's rebuild, then one
# agreed), dense, fp16 and bf16 issue their allreduces from the hook, in bucket mode and in
# model mode with the model in one bucket: the comm thread gets nothing, and the result is
# the in-hook path's bit for bit. Top-k, and model mode over several buckets, still go there.
for m, mode, cap, direct in (("dense", "bucket", SMALL_BUCKETS, True),
                             ("fp16", "bucket", SMALL_BUCKETS, True),
                             ("bf16", "bucket", SMALL_BUCKETS, True),
                             ("topk", "bucket", SMALL_BUCKETS, False),
                             ("dense", "model", ONE_BUCKET, True),
                             ("fp16", "model", ONE_BUCKET, True),
                             ("dense", "model", SMALL_BUCKETS, False)):
    runs = [Run(gh.make(m, density=0.1, mode=mode, overlap=overlap), cap=cap)
            for overlap in (True, False)]
    for r in runs:
        r.train(STEPS)
    worker = runs[0].state._worker  # noqa: SLF001
    handed: list[object] = []
    submit = worker.submit
    worker.submit = lambda *a, _s=submit, _h=handed: (_h.append(a), _s(*a))[1]
    for r in runs:
        r.train(2)
    check((not handed) == direct, f"{m} mode={mode} cap={cap}: {len(handed)} tasks went to "
                                  f"the comm thread in steady state")
    same(runs[0].params(), runs[1].params(), f"{m} mode={mode}: issued from the hook vs in "
                                             "the hook")

# (j) momentum correction: at density 1.0, with plain SGD, it is DDP with momentum SGD (up to
# rounding: the ranks average velocities instead of gradients); at density 0.1, in both modes
# and across the rebuild, residual + applied = residual before + velocity, and the velocity is
# m times the one before plus this rank's gradient.
for m in ("topk", "gtopk", "randomk", "dgc"):
    r = Run(gh.make(m, density=1.0, momentum=0.9), momentum=0.0)
    r.train(STEPS)
    same(r.params(), want, f"{m} at density 1.0 with momentum correction", exact=False,
         atol=1e-12)
for m in ("topk", "gtopk", "powersgd"):
    for mode in gh.MODES:
        tag = f"{m} mode={mode} momentum=0.9"
        state = gh.make(m, density=0.1, mode=mode, momentum=0.9)
        r = Run(state, momentum=0.0)
        net_params = list(r.net.parameters())
        for step in range(STEPS):
            before = state.state_dict()
            local = torch.autograd.grad(r.loss(r.net), net_params)
            r.backward()
            after = state.state_dict()
            g = torch.cat([t.reshape(-1) for t in local])
            velocity = by_position(state, after["velocities"])
            same(velocity, 0.9 * by_position(state, before["velocities"]) + g,
                 f"{tag} step {step}: velocity", exact=False, atol=1e-12)
            applied = torch.cat([q.grad.reshape(-1) for q in net_params])
            lhs = by_position(state, after["residuals"]) + applied
            rhs = by_position(state, before["residuals"]) + velocity
            dist.all_reduce(lhs)
            dist.all_reduce(rhs)
            same(lhs, rhs, f"{tag} step {step}: residual mass", exact=False, atol=1e-9)
            r.advance()

# A NaN gradient on one rank (step 1) is applied as NaN (GradScaler would skip that step; here
# the optimizer does), and restarts that rank's velocities at zero instead of poisoning every
# later step.
r = Run(gh.make("topk", density=0.1, momentum=0.9), momentum=0.0)
r.train(1)
r.opt.zero_grad()
loss = r.loss(r.ddp)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # the NaN/Inf policy's
    (loss * float("nan") if rank == p - 1 else loss).backward()
check(all(bool(q.grad.isnan().any()) for q in r.net.parameters()), "momentum: NaN not applied")
velocities = r.state.state_dict()["velocities"].values()
check(all(bool(v.isfinite().all()) for v in velocities)
      and (rank != p - 1 or all(bool((v == 0).all()) for v in velocities)),
      "momentum: the NaN step left a non-finite or non-zero velocity on the rank that made it")
r.step += 1
r.train(2)
check(bool(r.params().isfinite().all()), "momentum: parameters not finite after a NaN step")

# PowerSGD divides before summing, as DDP does: fp32 gradients equal on every rank whose sum
# over the ranks overflows average to themselves, in its matrices and its 1-D tensors.
for mode in gh.MODES:
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to(DEV)
    big = DDP(lin, bucket_cap_mb=ONE_BUCKET)
    gh.make("powersgd", rank=1, mode=mode).register(big)
    (big(torch.ones(1, 8, device=DEV)).sum() * 1e38).backward()
    for name, q in lin.named_parameters():
        check(bool(torch.allclose(q.grad, torch.full_like(q.grad, 1e38), rtol=1e-3)),
              f"powersgd mode={mode}: {name}'s average of 1e38 on every rank is "
              f"{q.grad.reshape(-1)[:2].tolist()}")

done()
dist.destroy_process_group()
