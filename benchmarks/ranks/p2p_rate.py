"""Rank 0 and rank 1 move one SIZE-byte tensor each way; print the measured Gbit/s."""
import datetime
import os
import time

import torch
import torch.distributed as dist

from gradwire.transport import Transport

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = Transport()
size = int(os.environ.get("SIZE", str(64 * 2**20)))
buf = torch.zeros(size, dtype=torch.uint8)
small = torch.zeros(1024, dtype=torch.uint8)
for src, dst in ((0, 1), (1, 0)):
    # A small message first so connection set-up is not timed.
    if t.rank == src:
        t.send(small, dst)
    else:
        t.recv(small, src)
    dist.barrier()
    t0 = time.perf_counter()
    if t.rank == src:
        t.send(buf, dst)
    else:
        t.recv(buf, src)
        dt = time.perf_counter() - t0
        print(f"RATE {src}->{dst} {size * 8 / dt / 1e9:.4f}")
    dist.barrier()
dist.destroy_process_group()
