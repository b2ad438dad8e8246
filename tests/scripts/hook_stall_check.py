"""A rank that stalls in steady state, where dense and fp16 issue their allreduces from the hook
(no comm thread): the other ranks' backward() raises GradwireError naming the timeout within
GRADWIRE_TIMEOUT (not gloo's 30 minutes), DDP finishes that backward, and once the stalled rank
comes back the process group is in step again. Rank 1 stalls; run on 2 ranks."""
import os
import time

os.environ["GRADWIRE_TIMEOUT"] = "2"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checklist import check, done, init  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gradwire.hooks as gh  # noqa: E402
from gradwire.errors import GradwireError  # noqa: E402

rank, p = init()
STALL = 5.0

for method in ("dense", "fp16"):
    torch.manual_seed(0)
    net = DDP(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2)), bucket_cap_mb=1e-5)
    state = gh.make(method)
    state.register(net)
    x = torch.ones(3, 6)
    for _ in range(3):  # the first step, DDP's rebuild, one agreed step
        net(x).sum().backward()
    handed: list[object] = []
    submit = state._worker.submit  # noqa: SLF001
    state._worker.submit = lambda *a, _s=submit, _h=handed: (_h.append(a), _s(*a))[1]  # noqa: SLF001
    if rank == 1:
        time.sleep(STALL)
    t0 = time.perf_counter()
    try:
        net(x).sum().backward()
        error = None
    except GradwireError as e:
        error = str(e)
    took = time.perf_counter() - t0
    check(handed == [], f"{method}: {len(handed)} buckets went to the comm thread")
    if rank == 1:
        check(error is None, f"{method}: the stalled rank failed: {error}")
    else:
        check(error is not None and error.startswith(f"rank {rank}: torch.distributed "
                                                      "all_reduce of")
              and "timed out after 2 s" in error, f"{method}: error {error!r}")
        check(1.5 < took < 4.5, f"{method}: backward raised after {took:.1f} s, not ~2 s")
    dist.barrier()  # the stalled rank's allreduces met the others' pending ones: in step again
    del net, state

done()
dist.destroy_process_group()
