"""Every registered algorithm against torch.distributed's own collectives, on every rank.

Integer-valued data (exactly representable in every dtype) must match exactly; random float32
must match dist.all_reduce within allclose. Transport byte and message counters must equal the
schedule's traffic exactly. Prints one FAIL line per problem and a final CHECKED line.
Tensors live on checklist.DEV (the GPU under NCCL).
"""
import os

import torch
import torch.distributed as dist
from checklist import DEV, counted, counters, done, fail, init

import gradwire.collectives as gc
from gradwire.collectives import executor
from gradwire.collectives.executor import execute
from gradwire.schedules import registry
from gradwire.schedules.cost import traffic
from gradwire.transport import Transport

rank, p = init()
if os.environ.get("GRADWIRE_TEST_STEPWISE"):  # NCCL's step-by-step execution, over gloo
    executor.STEPWISE = frozenset({dist.get_backend()})
if os.environ.get("GRADWIRE_TEST_DATAFLOW"):  # the dataflow executor, over NCCL too
    executor.STEPWISE = frozenset()
sizes = [int(s) for s in os.environ.get("SIZES", "0,1,2,3,5,7,13,16,24,33,1000").split(",")]
only = os.environ.get("ALGOS")  # "allreduce/ring,broadcast/lp"
# Non-default parameters worth executing too: many-block pipelines, several servers.
VARIANTS = {"lp": [{}, {"block": 3}], "dbtree": [{}, {"block": 3}], "ps": [{}, {"servers": p}]}
# 3-element blocks pipeline 11 blocks at 33 elements, more than any tree here is deep: 1000
# elements would be 334 blocks, a message each on every link, and most of this script's time.
MANY_BLOCKS_UP_TO = 64
dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def runs(params: dict, n: int) -> bool:
    """Whether a variant runs at size ``n``: the block variants only up to
    MANY_BLOCKS_UP_TO."""
    return "block" not in params or n <= MANY_BLOCKS_UP_TO


def dtypes_of(i: int) -> list[tuple[int, torch.dtype]]:
    """The dtypes the i-th size runs in (with their index): two, a wide one and a 2-byte one,
    in turn, so that every dtype meets odd and even sizes, small and large, at half the runs
    of every size in every dtype (ALL_DTYPES=1: all four)."""
    if os.environ.get("ALL_DTYPES"):
        return list(enumerate(dtypes))
    return [(j, dtypes[j]) for j in (i % 4, (i + 2) % 4)]


def data(n: int, seed: int, dtype: torch.dtype, r: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + r)
    return torch.randint(-4, 5, (n,), generator=g).to(DEV, dtype)


def everyone(n: int, seed: int) -> torch.Tensor:
    """All ranks' float64 inputs, [p, n]: each rank's is drawn from its own seed, so every
    rank makes them all (no collective to gather them)."""
    return torch.stack([data(n, seed, torch.float64, r) for r in range(p)])


for algo, params in [(a, v) for a in registry.ALGORITHMS for v in VARIANTS.get(a.name, [{}])]:
    tag = f"{algo.collective}/{algo.name}"
    if only and tag not in only.split(","):
        continue
    tag += "".join(f" {k}={v}" for k, v in params.items())
    for i, n in enumerate(sizes):
        if not runs(params, n):
            continue
        for di, dt in dtypes_of(i):
            seed = n * 7 + di
            root = (n + 1) % p
            allin = everyone(n if algo.collective != "allgather" else n, seed)
            total = allin.sum(0)
            x = data(n, seed, dt, rank)
            t = Transport()
            c = algo.collective
            if c == "allreduce":
                gc.all_reduce(x, algo=algo.name, transport=t, **params)
                got, want = x, total
            elif c == "reduce":
                gc.reduce(x, dst=root, algo=algo.name, transport=t, **params)
                got, want = (x, total) if rank == root else (None, None)
            elif c == "broadcast":
                gc.broadcast(x, src=root, algo=algo.name, transport=t, **params)
                got, want = x, allin[root]
            elif c == "allgather":
                out = torch.zeros(n * p, dtype=dt, device=DEV)
                gc.all_gather_into_tensor(out, x, algo=algo.name, transport=t, **params)
                got, want = out, allin.reshape(-1)
            else:  # reducescatter: input n*p, output n
                xin = torch.cat([data(n, seed + 99 * j, dt, rank) for j in range(p)])
                full = torch.zeros(n * p, dtype=torch.float64, device=DEV)
                dist.all_reduce(full.copy_(xin.double()))
                out = torch.zeros(n, dtype=dt, device=DEV)
                kept = xin.clone()
                gc.reduce_scatter_tensor(out, xin, algo=algo.name, transport=t, **params)
                got, want = out, full[rank * n : (rank + 1) * n]
                if not torch.equal(xin, kept):
                    fail(f"{tag} n={n} {dt}: reduce_scatter_tensor changed its input")
            counted()
            if got is not None and not torch.equal(got.double(), want):
                bad = (got.double() != want).nonzero()[0].item()
                fail(f"{tag} n={n} {dt}: element {bad} is {got[bad].item()}, "
                     f"expected {want[bad].item()}")
            count = n * p if c in ("allgather", "reducescatter") else n
            s = registry.schedule(c, algo.name, p, count, root if algo.rooted else 0,
                                  itemsize=x.element_size(), **params)
            counters(f"{tag} n={n} {dt}", t, traffic(s, x.element_size()), rank)
    # random float32 against the built-in all_reduce, sum and avg
    if algo.collective == "allreduce":
        for how in ("sum", "avg"):
            g = torch.Generator().manual_seed(rank)
            x = torch.randn(4099, generator=g).to(DEV)
            ref = x.clone()
            dist.all_reduce(ref)
            if how == "avg":
                ref /= p
            gc.all_reduce(x, op=how, algo=algo.name, **params)
            counted()
            if not torch.allclose(x, ref, rtol=1e-5, atol=1e-5):
                fail(f"{tag} float32 {how}: max error {(x - ref).abs().max().item()}")

# Broadcast and allgather only move bytes: any dtype, bit for bit (int64 beyond float64's exact
# integers, bool, uint8).
for algo in registry.ALGORITHMS:
    tag = f"{algo.collective}/{algo.name}"
    if algo.collective not in ("broadcast", "allgather") or (only and tag not in only.split(",")):
        continue
    for dt in (torch.int64, torch.uint8, torch.bool):
        g = torch.Generator().manual_seed(rank)
        x = torch.randint(0, 2 if dt == torch.bool else 200, (13,), generator=g).to(DEV, dt)
        if dt == torch.int64:
            x += 2**60
        counted()
        if algo.collective == "broadcast":
            want = x.clone()
            dist.broadcast(want, src=p - 1)
            gc.broadcast(x, src=p - 1, algo=algo.name)
            got = x
        else:
            want = torch.empty(13 * p, dtype=dt, device=DEV)
            dist.all_gather_into_tensor(want, x)
            got = torch.empty_like(want)
            gc.all_gather_into_tensor(got, x, algo=algo.name)
        if not torch.equal(got, want):
            fail(f"{tag} {dt}: differs from torch.distributed's")

# Out of place (the executor's ``source``, which reduce-scatter uses): the buffer starts as NaN,
# every schedule must read what it has not written from the source, and leave the source as it
# was; ranges it never wrote are taken from the source, as the API does.
for algo, params in [(a, v) for a in registry.ALGORITHMS for v in VARIANTS.get(a.name, [{}])]:
    tag = f"{algo.collective}/{algo.name}" + "".join(f" {k}={v}" for k, v in params.items())
    if only and f"{algo.collective}/{algo.name}" not in only.split(","):
        continue
    c = algo.collective
    for n in (n for n in (0, 1, 5, 13, 1000) if runs(params, n)):
        seed = n * 11 + 3
        root = (n + 2) % p if algo.rooted else 0
        count = n * p if c in ("allgather", "reducescatter") else n
        allin = torch.stack([data(count, seed, torch.float64, r) for r in range(p)])
        src = allin[rank].clone()
        if c == "allgather":  # every rank contributes its own block
            src.zero_()[rank * n : (rank + 1) * n] = allin[rank, rank * n : (rank + 1) * n]
        kept = src.clone()
        s = registry.schedule(c, algo.name, p, count, root, itemsize=8, **params)
        buf = torch.full((count,), float("nan"), dtype=torch.float64, device=DEV)
        unwritten = execute(s, buf, Transport(), source=src)
        for a, b in unwritten.within(0, count):
            buf[a:b] = src[a:b]
        total = allin.sum(0)
        if c == "allgather":
            want = torch.cat([allin[r, r * n : (r + 1) * n] for r in range(p)])
        else:
            want = {"allreduce": total, "broadcast": allin[root], "reduce": total,
                    "reducescatter": total}[c]
        lo, hi = ((rank * n, (rank + 1) * n) if c == "reducescatter" else (0, count))
        counted()
        if (c != "reduce" or rank == root) and not torch.equal(buf[lo:hi], want[lo:hi]):
            bad = lo + (buf[lo:hi] != want[lo:hi]).nonzero()[0].item()
            fail(f"{tag} n={n} out of place: element {bad} is {buf[bad].item()}, "
                 f"expected {want[bad].item()}")
        if not torch.equal(src, kept):
            fail(f"{tag} n={n} out of place: the source changed")
done()
dist.destroy_process_group()
