"""The hooks' hot path makes no host-device synchronisation, checked without a GPU.

For dense, fp16, topk, gtopk, int8 and powersgd under DDP (several buckets, bucket mode, the
defaults): the same training runs twice, on the host path and on the device path
(:func:`gradwire.syncfree.device_paths`, which runs the GPU's code on CPU tensors). On the
device path every synchronising tensor call (tests/sync_guard.py) made during a steady-state
backward is recorded: dense and fp16 may make none; the methods whose NaN/Inf status travels
with their data may make exactly one per step, the documented read of every bucket's status
(hooks/aggregate.py: ``_bucket`` on the comm thread; hooks/direct.py: ``_settle`` for int8
issued from the hook). Call headers are exempt: they are host tensors on a host transport by
design (hooks/comm.py, ``host_group``). Both paths must give the same gradients, bit for bit.
Under NCCL (tests/test_nccl.py) every tensor is on the GPU, and CUDA's own record of
synchronising operations (``torch.cuda.set_sync_debug_mode``) is counted too, under the same
allowance.
Prints one FAIL line per problem and a final CHECKED line.
"""
import contextlib
import pathlib
import sys
import traceback
import warnings

import torch
from checklist import DEV, check, done, init
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from sync_guard import SyncGuard  # noqa: E402

import gradwire.hooks as gh  # noqa: E402
from gradwire.syncfree import device_paths  # noqa: E402

rank, p = init()
ALLOWED = {"dense": 0, "fp16": 0, "topk": 1, "gtopk": 1, "int8": 1, "powersgd": 1}
OPTIONS = {"powersgd": {"rank": 2}}
WARM, WATCHED = 2, 3  # DDP rebuilds its buckets after step 0; the hook agrees on them at 2
HOST_SIDE = ("agree.py",)
READ_IN = ("aggregate.py", "direct.py")  # the hooks' modules that make the documented read
BUCKET_MB = 0.02  # about 5000 fp32 elements: one bucket per layer or two


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 40), nn.Tanh(), nn.Linear(40, 8)).to(DEV)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(16, 48, generator=g).to(DEV), torch.randn(16, 8, generator=g).to(DEV)


@contextlib.contextmanager
def cuda_syncs():
    """CUDA's own warnings of synchronising operations within the block (none on the CPU),
    each as "cuda: <message> at <file:line function> <- ..." from the innermost frame of the
    code that made it (past tests/sync_guard.py's wrappers), on whichever thread."""
    found: list[str] = []
    if DEV.type != "cuda":
        yield found
        return

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001
        text = str(message)
        if "synchroniz" not in text or "prototype feature" in text:  # the mode's own notice
            return
        frames = [f for f in reversed(traceback.extract_stack()[:-1])
                  if not f.filename.endswith(("sync_guard.py", "warnings.py"))]
        where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                            for f in frames[:4])
        found.append(f"cuda: {text.partition(' (Triggered')[0]} at {where}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")


def run(method: str, paths: contextlib.AbstractContextManager, guard: SyncGuard | None
        ) -> tuple[list[list[torch.Tensor]], list[tuple[list[str], list[str]]], float]:
    """(gradients after each step, the synchronising calls of each watched step: those the
    guard recorded, and CUDA's own record, apart: one read shows in both; the buckets issued
    from the hook)."""
    net = model()
    ddp = DDP(net, bucket_cap_mb=BUCKET_MB)
    state = gh.make(method, density=0.05, warmup=False, **OPTIONS.get(method, {}))
    state.register(ddp)
    grads, calls = [], []
    with paths:
        for step in range(WARM + WATCHED):
            x, y = batch(step)
            loss = ((ddp(x) - y) ** 2).mean()
            net.zero_grad()
            if guard is not None and step >= WARM:
                before = len(guard.calls)
                with guard.watching(), cuda_syncs() as cuda:
                    loss.backward()
                calls.append(([f"{name} at {where}" for name, where in guard.calls[before:]
                               if not any(h in where for h in HOST_SIDE)], cuda))
            else:
                loss.backward()
            grads.append([q.grad.clone() for q in net.parameters()])
    return grads, calls, state.stats["issued"]


with SyncGuard() as guard:
    for method, allowed in ALLOWED.items():
        host, _, _ = run(method, contextlib.nullcontext(), None)
        device, calls, issued = run(method, device_paths(), guard)
        if method in ("dense", "fp16", "int8"):  # the watched steps go from the hook
            check(issued > 0, f"{method}: no bucket was issued from the hook")
        print(f"SYNCS rank {rank} {method}: {[len(py) for py, _ in calls]} per watched step",
              flush=True)
        for step, (py, cuda) in enumerate(calls, WARM):
            # the guard sees exactly the documented read (a guard that saw nothing would pass
            # a looser check); CUDA's own record, where there is one, at most that
            check(len(py) == allowed, f"{method} step {step}: {len(py)} synchronising calls "
                  f"seen by the guard, {allowed} expected: {' | '.join(py)}")
            check(len(cuda) <= allowed, f"{method} step {step}: {len(cuda)} synchronising "
                  f"calls seen by CUDA, {allowed} allowed: {' | '.join(cuda)}")
            for found in (py, cuda):
                check(all(c.partition(" at ")[2].startswith(READ_IN) for c in found),
                      f"{method} step {step}: a synchronising call outside the documented "
                      f"read: {' | '.join(found)}")
        same = all(torch.equal(a, b) for hs, ds in zip(host, device, strict=True)
                   for a, b in zip(hs, ds, strict=True))
        check(same, f"{method}: the device path's gradients differ from the host path's")
done()
