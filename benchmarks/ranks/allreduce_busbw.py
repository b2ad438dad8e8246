"""torch.distributed's built-in all_reduce (gloo) of SIZE bytes of fp32; rank 0 prints busbw.

busbw follows nccl-tests: algbw = S / t, busbw = algbw * 2(P-1)/P.
"""
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
p = dist.get_world_size()
size = int(os.environ.get("SIZE", str(64 * 2**20)))
iters = int(os.environ.get("ITERS", "5"))
x = torch.ones(size // 4)
dist.all_reduce(x)  # warm-up: connections and buffers
times = []
for _ in range(iters):
    x.fill_(1.0)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    times.append(time.perf_counter() - t0)
wrong = int((x != p).sum())
if dist.get_rank() == 0:
    t = statistics.median(times)
    busbw = size / t * 2 * (p - 1) / p
    print(f"BUSBW size={size} p={p} time_s={t:.6f} algbw_gbit={size * 8 / t / 1e9:.4f} "
          f"busbw_gbit={busbw * 8 / 1e9:.4f} wrong={wrong}")
dist.destroy_process_group()
