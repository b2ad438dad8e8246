"""One rank of benchmarks/header_overhead.py: the same call with and without the header
exchange, interleaved, median seconds of each (each call's time the slowest rank's, from a
common barrier: a call lasts as long as its slowest rank); rank 0 prints one ROW line of JSON
per case."""
import datetime
import json
import statistics

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.bench.rank import taking_turns
from gradwire.collectives.agree import agree
from gradwire.sparse import sparse_allreduce
from gradwire.transport import Transport

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
checked, unchecked = Transport(check_calls=True), Transport(check_calls=False)
ITERS = 15


def case(name: str, nbytes: int, fn) -> None:
    # one untimed call of each first (connections, schedule caches), then in turns; each
    # time the slowest rank's (rank 0's own had been taken, whichever rank finished last)
    on, off = taking_turns([lambda: fn(checked), lambda: fn(unchecked)], ITERS, warmup=1)
    a, b = statistics.median(on), statistics.median(off)
    if dist.get_rank() == 0:
        print("ROW " + json.dumps({"case": name, "bytes": nbytes, "checked_ms": a * 1e3,
                                   "unchecked_ms": b * 1e3,
                                   "overhead_pct": 100 * (a - b) / b if b > 1e-4 else None}),
              flush=True)


header = [("call", "allreduce"), ("algo", "ring"), ("elements", 1), ("dtype", "float32")]
case("header exchange alone", 0, lambda t: agree(checked, header) if t is checked else None)
for n in (256, 16_384, 262_144, 4_194_304):
    x = torch.ones(n)
    case(f"all_reduce ring {4 * n} B", 4 * n, lambda t, x=x: gc.all_reduce(x, transport=t))
m = 4_000_000
g, r = torch.randn(m), torch.zeros(m)
case("sparse_allreduce gtopk m=4M k=4000", 8 * 4000,
     lambda t: sparse_allreduce(g, r, 4000, "gtopk", transport=t))
dist.destroy_process_group()
