"""Randomized point-to-point exchange; each rank checks data and prints its counters as JSON.

Every rank draws the same plan from the seed: a list of (src, dst, numel, dtype) messages.
"""
import datetime
import json
import os
import random

import torch
import torch.distributed as dist

from gradwire.transport import P2P, Transport, wait_all

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = Transport()
rank, world = t.rank, t.world_size
rng = random.Random(int(os.environ.get("SEED", "0")))
dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8]
plan = []
for _ in range(int(os.environ.get("MESSAGES", "40"))):
    src, dst = rng.sample(range(world), 2)
    plan.append((src, dst, rng.choice([0, 1, 3, 7, 64, 1000, 4097]), rng.choice(dtypes)))
posted = {"sent": [0] * world, "received": [0] * world}
mode = os.environ.get("MODE", "batch")
for i, (src, dst, n, dt) in enumerate(plan):
    payload = (torch.arange(n, dtype=torch.float64) + i).to(dt)
    if rank == src:
        posted["sent"][dst] += n * payload.element_size()
        if mode == "batch":
            wait_all(t.batch([P2P("send", payload, dst)]))
        else:
            t.send(payload, dst)
    elif rank == dst:
        got = torch.empty(n, dtype=dt)
        posted["received"][src] += n * got.element_size()
        if mode == "batch":
            wait_all(t.batch([P2P("recv", got, src)]))
        else:
            t.recv(got, src)
        assert torch.equal(got, payload), f"message {i} from {src} corrupted"
print("COUNTERS " + json.dumps({"rank": rank, "posted": posted, "sent": t.bytes_sent,
                                "received": t.bytes_received}))
dist.destroy_process_group()
