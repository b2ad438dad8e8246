"""One rank of a fault test under `gradwire run`: loop a collective until something fails.

KIND: ring | tree | gtopk. KILL_RANK with KILL_AFTER seconds: that rank SIGKILLs itself then,
from a timer thread, so mid-collective. Every rank prints READY after its first full call
(the test may then take a link down). A PeerError is printed as ``PEERERROR <peer> <message>``
and the rank exits 3; anything else is a traceback (exit 1).
"""
import datetime
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

import gradwire.collectives as gc
from gradwire.errors import PeerError
from gradwire.sparse import sparse_allreduce

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
kind = os.environ.get("KIND", "ring")
x = torch.randn(200_000)


def call() -> None:
    if kind == "gtopk":
        sparse_allreduce(x, torch.zeros_like(x), 2000, "gtopk")
    else:
        gc.all_reduce(x, algo=kind)


call()
print("READY", flush=True)
if os.environ.get("KILL_RANK") == str(rank):
    threading.Timer(float(os.environ.get("KILL_AFTER", "0.2")),
                    lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
try:
    while True:
        call()
except PeerError as e:
    print(f"PEERERROR {e.peer} {e}", flush=True)
    sys.exit(3)
