"""What the header exchange guarantees (gradwire.collectives.agree), on every rank.

- Mismatched calls: every rank raises the same MismatchError before any state changes, then
  carries on in step (the next matched call gives the right answer).
- NaN/Inf on one rank: every rank aggregates dense (the result holds them as a dense
  allreduce would) and no residual is left non-finite.
- Last, one rank skipping the final call: the others' PeerError names it within the timeout.
Prints one FAIL line per problem and a final CHECKED line.
"""
import datetime
import time
import warnings

import torch
import torch.distributed as dist
from checklist import check, done
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.collectives as gc
import gradwire.hooks as gh
from gradwire.catalogue.methods import get as get_method
from gradwire.collectives.agree import FIELD_BYTES, FIELDS, MismatchError
from gradwire.errors import PeerError
from gradwire.schedules import registry
from gradwire.schedules.cost import traffic
from gradwire.sparse import sparse_allreduce
from gradwire.transport import Transport

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, p = dist.get_rank(), dist.get_world_size()
TIMEOUT = 3.0
t = Transport(timeout=TIMEOUT)



def expect_mismatch(name: str, call, words: list[str]) -> None:
    """``call`` must raise MismatchError naming every word; then a matched call must work."""
    try:
        call()
        check(False, f"{name}: no error")
    except MismatchError as e:
        msg = str(e)
        check(all(w in msg for w in words), f"{name}: message lacks {words}: {msg}")
        check(msg.startswith(f"rank {rank}:"), f"{name}: message does not name this rank")
    x = torch.full((7,), float(rank + 1))
    gc.all_reduce(x, transport=t)
    check(torch.equal(x, torch.full((7,), p * (p + 1) / 2)), f"{name}: next call wrong: {x}")


odd = rank == p - 1  # the rank that disagrees
expect_mismatch("size", lambda: gc.all_reduce(torch.ones(100 + odd), transport=t),
                ["elements", "100 on ranks", f"101 on rank {p - 1}"])
expect_mismatch("dtype", lambda: gc.all_reduce(
    torch.ones(10, dtype=torch.float64 if odd else torch.float32), transport=t),
    ["dtype", "float32", "float64"])
expect_mismatch("algorithm", lambda: gc.all_reduce(
    torch.ones(64), algo="tree" if odd else "ring", transport=t), ["algo", "ring", "tree"])
expect_mismatch("root", lambda: gc.broadcast(torch.ones(8), src=1 if odd else 0, transport=t),
                ["root"])
expect_mismatch("params", lambda: gc.broadcast(
    torch.ones(64), algo="lp", block=4 if odd else 8, transport=t), ["params", "block=4"])
expect_mismatch("collective", lambda: (gc.broadcast if odd else gc.all_reduce)(
    torch.ones(8), transport=t), ["call", "broadcast", "allreduce"])

# The header's bytes: recursive doubling of 7 × 24 bytes per rank, counted apart from data;
# none with the exchange turned off.
before = t.control_bytes_sent
gc.all_reduce(torch.ones(5), transport=t)
header = registry.schedule("allgather", "rd", p, p * FIELD_BYTES * (FIELDS + 1), itemsize=1)
want_bytes = int(traffic(header, 1).bytes_sent.sum(1)[rank])
check(t.control_bytes_sent - before == want_bytes,
      f"header bytes {t.control_bytes_sent - before}, expected {want_bytes}")
off = Transport(timeout=TIMEOUT, check_calls=False)
gc.all_reduce(torch.ones(5), transport=off)
check(off.control_bytes_sent == 0 and sum(off.bytes_sent) == int(
    traffic(registry.schedule("allreduce", "ring", p, 5), 4).bytes_sent.sum(1)[rank]),
    f"check_calls=False: control {off.control_bytes_sent}, data {sum(off.bytes_sent)}")

# Sparse: a density (k) or method mismatch fails before the residual is touched.
g = torch.Generator().manual_seed(rank)
x = torch.randn(200, generator=g)
residual = torch.randn(200, generator=g)
before = residual.clone()
expect_mismatch("density", lambda: sparse_allreduce(x, residual, 10 + odd, "gtopk", transport=t),
                ["k:", "10 on rank", "11 on rank"])
check(torch.equal(residual, before), "density: residual changed by a failed call")
expect_mismatch("method", lambda: sparse_allreduce(x, residual, 10, "topk" if odd else "gtopk",
                                                   transport=t),
                ["method", "gtopk on ranks", "topk on rank"])
check(torch.equal(residual, before), "method: residual changed by a failed call")
expect_mismatch("schedule", lambda: sparse_allreduce(x, residual, 10, "gtopk", transport=t,
                                                     algo="tree" if odd else "rd"),
                ["method", "gtopk on rank", "gtopk/tree on rank"])
check(torch.equal(residual, before), "schedule: residual changed by a failed call")

# One rank skips a call and goes on to the next: the next one is compared with the skipped.
first, second = torch.ones(30), torch.ones(40)


def skip_one() -> None:
    if not odd:
        gc.all_reduce(first, transport=t)
    gc.all_reduce(second, transport=t)


expect_mismatch("skipped call", skip_one, ["elements", "30 on rank", "40 on rank"])

def expect_densities(name: str, net: DDP, densities: tuple[str, str]) -> None:
    """The next backward of ``net`` must fail on every rank naming both densities."""
    try:
        net(torch.randn(4, 50)).sum().backward()
        check(False, f"{name}: no error")
    except Exception as e:  # the hook's GradwireError, raised from backward unchanged
        check("density" in str(e) and all(d in str(e) for d in densities),
              f"{name}: message lacks the densities: {str(e)[:300]}")


# DDP hooks: a different density on one rank fails in backward on every rank.
torch.manual_seed(0)
net = DDP(nn.Linear(50, 20))
state = gh.make("topk", density=0.1 if odd else 0.05, warmup=False)
state.register(net)
expect_densities("hook density", net, ("0.05", "0.1"))

# DDP hooks: compressor options that differ fail naming them, before anything is sent (qsgd's
# levels would silently give different averages; PowerSGD's rank, messages of other lengths),
# and so do the hook's own options that steady-state steps no longer check: the mode and the
# dense steps.
for method, opts, words in (("qsgd", {"s": 100 if odd else 255}, ["qsgd s=255", "qsgd s=100"]),
                            ("powersgd", {"rank": 2 if odd else 1}, ["rank=1", "rank=2"]),
                            ("topk", {"mode": "model" if odd else "bucket"}, ["mode=model"]),
                            ("topk", {"dense_steps": 3 if odd else 1},
                             ["hook dense_steps=1", "hook dense_steps=3"])):
    torch.manual_seed(0)
    net = DDP(nn.Linear(50, 20))
    gh.make(method, warmup=False, overlap=False, **opts).register(net)
    try:
        net(torch.randn(4, 50)).sum().backward()
        check(False, f"hook {method} options: no error")
    except Exception as e:  # the hook's GradwireError, raised from backward unchanged
        check("ranks made different collective calls" in str(e)
              and all(w in str(e) for w in words),
              f"hook {method} options: message lacks {words}: {str(e)[:300]}")

# A default spelled out on one rank and left out on another is the same call.
torch.manual_seed(0)
net = DDP(nn.Linear(50, 20))
gh.make("qsgd", warmup=False, overlap=False, **({"s": 255} if odd else {})).register(net)
try:
    net(torch.randn(4, 50)).sum().backward()
except Exception as e:  # noqa: BLE001 - any failure is the defect checked for
    check(False, f"hook qsgd s=255 against the default: {str(e)[:300]}")

# DDP hooks in steady state: once a step has agreed on the buckets, steps without a density
# warm-up exchange no header at all.
# Methods whose NaN/Inf status cannot travel with their data (a sign, a vote, a random
# subset may hide a NaN) exchange it in a header every step: one per aggregation (here one
# bucket).
for method in gh.METHODS:  # every method, in both modes
    in_band = get_method(method).path.in_band(get_method(method))
    for mode in ("bucket", "model"):
        torch.manual_seed(0)
        net = DDP(nn.Linear(50, 20))
        state = gh.make(method, density=0.1, mode=mode, warmup=False)
        state.register(net)
        for step in range(5):
            net(torch.randn(4, 50)).sum().backward()
            if step == 1:
                agreed = state._comm.headers
        check(agreed > 0 and state._comm.headers - agreed == (0 if in_band else 3),
              f"steady state, {method} {mode}: {state._comm.headers - agreed} header "
              f"exchanges in steps 2-4 ({agreed} before), in band: {in_band}")

# With a density warm-up each step exchanges one, so set_epoch on one rank alone fails on
# every rank, naming the densities, before anything of that step is sent.
torch.manual_seed(0)
net = DDP(nn.Linear(50, 20))
state = gh.make("topk", density=0.05, warmup=[0.5], steps_per_epoch=100)
state.register(net)
for _ in range(2):
    net(torch.randn(4, 50)).sum().backward()
if odd:
    state.set_epoch(1)
expect_densities("set_epoch on one rank", net, ("0.5", "0.05"))

# NaN/Inf policy, sparse_allreduce: rank p-1 has a NaN and an Inf; every rank goes dense.
x = torch.randn(200, generator=g)
if odd:
    x[3], x[7] = float("nan"), float("inf")
xs = [torch.empty(200) for _ in range(p)]
rs = [torch.empty(200) for _ in range(p)]
dist.all_gather(xs, x)
dist.all_gather(rs, residual)
want = (torch.stack(xs) + torch.stack(rs)).sum(0) / p
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = sparse_allreduce(x, residual, 10, "gtopk", transport=t)
check(any("NaN or Inf" in str(w.message) for w in caught), "nan: no warning")
check(torch.allclose(got, want, equal_nan=True) and got[3].isnan() and got[7].isinf(),
      f"nan: result is not the dense average: {got[:8]}")
check(bool((residual == 0).all()), "nan: residual not cleared")
got = sparse_allreduce(torch.ones(200), residual, 200, "gtopk", transport=t)
check(torch.equal(got, torch.ones(200)), "nan: the next call is wrong")

# NaN/Inf policy, DDP hook (gtopk, error feedback): every rank's gradient holds the Inf as
# DDP's own allreduce would give it, and no residual holds NaN or Inf afterwards.
torch.manual_seed(0)
net = DDP(nn.Linear(50, 20))
state = gh.make("gtopk", density=0.05, warmup=False)
state.register(net)
for step in range(3):
    data = torch.randn(4, 50)
    if odd and step == 1:
        data[0, 0] = float("inf")
    net.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net(data).sum().backward()
    grad = net.module.weight.grad
    res = list(state.ef.residuals.values())
    check(all(bool(r.isfinite().all()) for r in res), f"hook nan step {step}: residual "
          "holds NaN or Inf")
    check((not grad.isfinite().all()) == (step == 1), f"hook nan step {step}: gradient "
          f"finite={bool(grad.isfinite().all())}")

# Last: one rank skips the final call; the others must time out naming it, not hang.
if rank != p - 1:
    start = time.monotonic()
    try:
        gc.all_reduce(torch.ones(16), transport=t)
        check(False, "final skipped call: no error")
    except PeerError as e:
        took = time.monotonic() - start
        # Each rank names the peer it waits on; rank 0 is the skipper's partner (rd, any P).
        check(e.peer == p - 1 or rank != 0, f"final skipped call: names rank {e.peer}: {e}")
        check("timed out" in str(e) and "header exchange" in str(e),
              f"final skipped call: {e}")
        check(took < 3 * TIMEOUT, f"final skipped call took {took:.1f} s")
else:
    time.sleep(2 * TIMEOUT)
done()
