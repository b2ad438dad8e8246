"""Kill one rank mid-collective, TRIALS times with seeded random choices, on the emulated
cluster (CLUSTER=emulated: one 4-host 1 Gbit/s cluster for every trial, rank r in host r's
network namespace) or on loopback (the default).

One process imports torch once and forks the ranks of every trial (fork before any gloo or
thread exists in this parent), so a trial costs a rendezvous, not P interpreter starts; on the
emulated cluster a forked rank first enters its host's namespace (setns). The
ranks loop one collective; after a random delay the parent SIGKILLs one of them. Every other
rank must raise PeerError (naming itself, a peer and the collective) and exit on its own within
the bound; at least one must name the victim. Prints one FAIL line per problem and CHECKED.

Environment: TRIALS (20), SEED (7), TIMEOUT (transport seconds, 3), CLUSTER (loopback).
"""
import contextlib
import ctypes
import datetime
import multiprocessing as mp
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist
from checklist import check, done, fails

import gradwire.collectives as gc
from gradwire.cluster import Host, ephemeral_cluster
from gradwire.errors import PeerError
from gradwire.launcher import free_port
from gradwire.sparse import sparse_allreduce
from gradwire.transport import Transport

TRIALS = int(os.environ.get("TRIALS", "20"))
TIMEOUT = float(os.environ.get("TIMEOUT", "3"))
# (label in the error, what one rank runs in a loop)
KINDS = {
    "allreduce/ring": lambda x, t: gc.all_reduce(x, algo="ring", transport=t),
    "allreduce/tree": lambda x, t: gc.all_reduce(x, algo="tree", transport=t),
    "broadcast/lp": lambda x, t: gc.broadcast(x, algo="lp", block=4096, transport=t),
    "allreduce/ps": lambda x, t: gc.all_reduce(x, algo="ps", transport=t),
    "gtopk": lambda x, t: sparse_allreduce(x, torch.zeros_like(x), 3000, "gtopk",
                                                transport=t),
}
phases = {"header": 0, "data": 0}  # where the survivors' errors happened
CLONE_NEWNET = 0x40000000


def enter(host: Host | None) -> None:
    """Move this (single-threaded, just forked) process into ``host``'s network namespace
    (nothing on loopback)."""
    if host is None or host.netns is None:
        return
    fd = os.open(f"/run/netns/{host.netns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {host.netns}")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = host.ifname



def rank_main(kind: str, rank: int, p: int, port: int, hosts, ready, report) -> None:
    enter(hosts[rank] if hosts else None)
    master = hosts[0].addr if hosts else "127.0.0.1"
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=p, timeout=datetime.timedelta(seconds=30))
    t = Transport(timeout=TIMEOUT)
    x = torch.randn(300_000)
    KINDS[kind](x, t)  # one full call before the clock starts
    ready.send(True)
    try:
        while True:
            KINDS[kind](x, t)
    except PeerError as e:
        report.send((e.peer, str(e)))
        os._exit(3)
    except BaseException as e:  # anything else is a failure of this test
        report.send((-1, f"{type(e).__name__}: {e}"))
        os._exit(4)


def trial(i: int, rng: random.Random, hosts: list[Host] | None) -> None:
    kind = rng.choice(sorted(KINDS))
    p = rng.choice([2, 3, 4])
    victim = rng.randrange(p)
    delay = rng.uniform(0.0, 0.3)
    tag = f"trial {i} ({kind}, P={p}, kill rank {victim} after {delay:.2f} s)"
    ctx = mp.get_context("fork")
    port = free_port() if hosts is None else 29600 + i  # a fresh namespace: every port free
    pipes = [ctx.Pipe(duplex=False) for _ in range(p)]
    reports = [ctx.Pipe(duplex=False) for _ in range(p)]
    procs = [ctx.Process(target=rank_main, args=(kind, r, p, port, hosts, pipes[r][1],
                                                     reports[r][1]))
             for r in range(p)]
    for q in procs:
        q.start()
    try:
        for r in range(p):
            if not pipes[r][0].poll(60):
                check(False, f"{tag}: rank {r} never got ready")
                return
            pipes[r][0].recv()
        time.sleep(delay)
        os.kill(procs[victim].pid, signal.SIGKILL)
        start = time.monotonic()
        named = []
        for r in range(p):
            if r == victim:
                continue
            # Bound: a neighbour sees the closed connection at once; a rank further away
            # waits on a neighbour that exits at once too: a few timeouts at the very worst.
            procs[r].join(4 * TIMEOUT + 5)
            took = time.monotonic() - start
            code = procs[r].exitcode
            check(code == 3, f"{tag}: rank {r} exit code {code} after {took:.1f} s")
            if reports[r][0].poll(0):
                peer, msg = reports[r][0].recv()
                named.append(peer)
                phases["header" if "header exchange" in msg else "data"] += 1
                check(msg.startswith(f"rank {r} in ") and kind in msg and f"rank {peer}" in msg,
                      f"{tag}: rank {r} said: {msg}")
        check(victim in named, f"{tag}: no rank named the victim {victim}: {named}")
    finally:
        for q in procs:
            if q.is_alive():
                q.kill()
            q.join(5)
        check(not any(q.is_alive() for q in procs), f"{tag}: a rank survived")


if __name__ == "__main__":
    rng = random.Random(int(os.environ.get("SEED", "7")))
    t0 = time.monotonic()
    emulated = os.environ.get("CLUSTER", "loopback") == "emulated"
    with (ephemeral_cluster(4, "1gbit") if emulated else contextlib.nullcontext()) as c:
        if c is not None:
            print(f"CLUSTER {c.name}", flush=True)
        for i in range(TRIALS):
            trial(i, rng, c.hosts if c is not None else None)
    # Kills must land in the data phase too, not only in the header exchange (about 24 of 42
    # survivor reports did here).
    check(phases["data"] >= 5, f"errors by phase: {phases}")
    print(f"TRIALS trials={TRIALS} cluster={'emulated' if emulated else 'loopback'} "
          f"phases={phases} seconds={time.monotonic() - t0:.1f}",
          flush=True)
    done()
    sys.exit(1 if fails else 0)
