"""Calls that fail on one rank fail on every rank at once, and leave nothing behind: an
argument one rank refuses reaches the others in the call's header exchange (they named no
one and waited until GRADWIRE_TIMEOUT); a rank missing from the first Transport fails its
peers after GRADWIRE_TIMEOUT (they waited c10d's 30 minutes); and header bytes never count as
data, even when the counters are reset during an async call's header exchange. (Buffers a
failed call may still receive into: test_collectives_pool.py.)"""

import datetime
import json
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradwire.collectives as gc
from gradwire.launcher import free_port
from gradwire.sparse import gtopk_allreduce, sparse_allreduce
from gradwire.transport import Transport

WORLD = 3
TIMEOUT = 10  # GRADWIRE_TIMEOUT in the first world: what a peer waited on a refusing rank
PROMPT = 3  # seconds within which every rank fails (a refusal takes milliseconds)
DEADLINE = 25  # seconds a rank may take in all (c10d's own wait for a new group is 30 min)


def _attempt(fn) -> dict:
    """What ``fn()`` did on this rank: its result or its error, and how long it took."""
    t0 = time.perf_counter()
    try:
        got = fn()
        return {"ok": got, "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 (the message is what is checked)
        return {"error": type(e).__name__, "message": str(e), "seconds": time.perf_counter() - t0}


def _refusals(rank: int, seen: dict) -> None:
    """Calls that one rank (or two) refuses, each followed by a matched call that must work."""
    ones = torch.ones(6)

    def reduced(fn, x: torch.Tensor) -> list:
        fn(x)
        return x.tolist()

    t = Transport()  # every rank's first: the twin gloo group is made here, all ranks present
    cases = {
        "dtype": lambda: reduced(lambda x: gc.all_reduce(x, transport=t),
                                 torch.ones(6, dtype=torch.bool if rank == 1 else torch.float32)),
        "op": lambda: reduced(lambda x: gc.all_reduce(x, op="band" if rank == 2 else "sum"), ones),
        "size": lambda: reduced(lambda x: gc.all_gather_into_tensor(
            x, torch.ones(2)), torch.zeros(5 if rank == 0 else 6)),
        "strided": lambda: reduced(lambda x: gc.reduce_scatter_tensor(
            x, torch.ones(12)[::2] if rank == 1 else torch.ones(6)), torch.zeros(2)),
        "algo": lambda: reduced(lambda x: gc.broadcast(x, algo="nope" if rank == 2 else "binomial"),
                                ones.clone()),
        "device": lambda: reduced(gc.all_reduce,
                                  torch.ones(6, device="meta" if rank == 1 else "cpu")),
        "async": lambda: (gc.all_reduce(torch.ones(6, dtype=torch.bool)) if rank == 1
                          else gc.all_reduce(torch.ones(6), async_op=True).wait()),
        "sparse": lambda: sparse_allreduce(torch.ones(6), torch.zeros(6), 0 if rank == 1 else 2,
                                           transport=t).tolist(),
        "gtopk": lambda: gtopk_allreduce(torch.ones(2), torch.tensor([0, 1 if rank else 7]), 6,
                                         torch.zeros(6), transport=t).indices.tolist(),
        "two": lambda: reduced(lambda x: gc.all_reduce(x, op="band" if rank == 0 else "sum"),
                               torch.ones(6, dtype=torch.bool if rank == 2 else torch.float32)),
    }
    for name, fn in cases.items():
        t.reset_counters()
        seen[name] = _attempt(fn)
        if name == "dtype":
            seen[name]["counted"] = [sum(t.bytes_sent), sum(t.bytes_received),
                                     t.control_bytes_sent]
        seen[name]["after"] = _attempt(lambda: reduced(gc.all_reduce, torch.ones(2)))


def _reset_in_flight(rank: int, seen: dict, out: str) -> None:
    """Rank 0 resets its counters while its async allreduce's header exchange waits on rank 2
    (its last header send reads rank 2's header), then rank 2 makes the call."""
    t = Transport()
    gc.all_reduce(torch.ones(6), transport=t)
    t.reset_counters()
    gc.all_reduce(torch.ones(6), transport=t)
    want = [t.bytes_sent, t.messages_sent]
    go = os.path.join(out, "reset done")
    t.reset_counters()
    if rank == 2:
        while not os.path.exists(go):
            time.sleep(0.01)
    h = gc.all_reduce(torch.ones(6), transport=t, async_op=True)
    if rank == 0:
        while t.control_bytes_sent == 0:  # its first header send left: the exchange is on
            time.sleep(0.01)
        seen["in flight"] = not h.is_completed()
        t.reset_counters()
        open(go, "w").close()
    h.wait()
    seen["counters"] = {"want": want, "got": [t.bytes_sent, t.messages_sent],
                        "control": t.control_bytes_sent}


def _missing_rank(rank: int, seen: dict) -> None:
    """Rank 2 fails before its first Transport; the others make a call."""
    if rank == 2:
        return
    seen["first call"] = _attempt(lambda: gc.all_reduce(torch.ones(2)))


def _rank(rank: int, urls: list, out: str) -> None:
    seen: dict = {}

    def save() -> None:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)

    def give_up() -> None:  # still waiting: what it saw so far, and no hang
        seen["gave up"] = f"still waiting after {DEADLINE} s"
        save()
        os._exit(0)

    threading.Timer(DEADLINE, give_up).start()
    os.environ["GRADWIRE_TIMEOUT"] = str(TIMEOUT)
    dist.init_process_group("gloo", init_method=urls[0], rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=30))
    _refusals(rank, seen)
    _reset_in_flight(rank, seen, out)
    dist.destroy_process_group()
    save()
    os.environ["GRADWIRE_TIMEOUT"] = "1"
    dist.init_process_group("gloo", init_method=urls[1], rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=30))
    _missing_rank(rank, seen)
    save()
    os._exit(0)  # a world whose first group failed: nothing to tear down cleanly


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> list[dict]:
    """What each of WORLD gloo ranks saw: refused calls and the counters in the first world,
    a rank missing from the first Transport in the second."""
    out = tmp_path_factory.mktemp("failfast")
    urls = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    mp.start_processes(_rank, args=(urls, str(out)), nprocs=WORLD, start_method="spawn")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


# --- an argument one rank refuses fails every rank at once ---------------------------------------

REFUSED = {  # case: (the refusing rank, the call as its peers name it, its reason)
    "dtype": (1, "allreduce/ring", "tensor has dtype torch.bool: expected one of"),
    "op": (2, "allreduce/ring", "reduction op 'band' is not supported"),
    "size": (0, "allgather/ring", "output must have world_size × input = 3 × 2 elements"),
    "strided": (1, "reducescatter/ring", "input must be contiguous"),
    "algo": (2, "broadcast/binomial", "unknown broadcast algorithm 'nope'"),
    "device": (1, "allreduce/ring", "gloo sends cpu tensors, got one on meta"),
    "async": (1, "allreduce/ring", "tensor has dtype torch.bool"),
    "sparse": (1, "sparse_allreduce/gtopk", "sparse_allreduce: k must be an integer >= 1"),
    "gtopk": (0, "gtopk_allreduce/gtopk", "gtopk_allreduce: indices must lie in [0, 6), got 0..7"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_argument_one_rank_refuses_fails_every_rank_at_once_naming_it(world, case):
    """The refusing rank raised alone; its peers waited on it until GRADWIRE_TIMEOUT and then
    named it as stalled. Now every peer fails within a second or two, in one line naming the
    rank and its reason, and the next call runs on every rank."""
    bad, what, reason = REFUSED[case]
    for rank, seen in enumerate(world):
        got = seen[case]
        assert "error" in got, f"rank {rank}: {got}"
        assert "\n" not in got["message"]
        assert got["seconds"] < PROMPT, f"rank {rank} took {got['seconds']:.1f} s: {got['message']}"
        if rank == bad:
            assert got["error"] == "GradwireError" and reason in got["message"]
        else:
            assert got["error"] == "RefusedError", got["message"]
            assert got["message"].startswith(f"rank {rank}: no rank runs {what}: rank {bad} "
                                             f"refused it: {reason}")
        assert got["after"]["ok"] == [3.0, 3.0], f"rank {rank}: {got['after']}"


def test_ranks_refusing_for_different_reasons_are_each_named(world):
    said = world[1]["two"]["message"]
    assert said.startswith("rank 1: no rank runs allreduce/ring: rank 0 refused it: reduction "
                           "op 'band' is not supported")
    assert "; rank 2 refused it: tensor has dtype torch.bool" in said
    for rank in (0, 2):
        assert world[rank]["two"]["error"] == "GradwireError"
    for seen in world:
        assert seen["two"]["seconds"] < PROMPT


def test_a_refused_call_moves_no_data(world):
    """Only headers cross: no data bytes sent or received on any rank."""
    for seen in world:
        sent, received, control = seen["dtype"]["counted"]
        assert (sent, received) == (0, 0) and control > 0


# --- a rank missing from the first Transport ------------------------------------------------------

def test_a_rank_missing_from_the_first_transport_fails_the_others_after_the_timeout(world):
    """Every rank's first Transport makes a second gloo group; c10d waits 30 minutes for a
    rank that never comes. Now the others fail after GRADWIRE_TIMEOUT (1 s here), in one
    line."""
    for rank in (0, 1):
        got = world[rank].get("first call", world[rank].get("gave up"))
        assert isinstance(got, dict) and got["error"] == "GradwireError", got
        assert got["seconds"] < 5
        assert got["message"].startswith(f"rank {rank}: connecting to the other ranks")
        assert "timed out after 1 s" in got["message"] and "GRADWIRE_TIMEOUT" in got["message"]
        assert "\n" not in got["message"]


# --- header bytes never count as data ------------------------------------------------------------

def test_counters_reset_during_a_header_exchange_count_no_header_as_data(world):
    """reset_counters ended the header exchange's control block: the header sends after it
    counted as data (504 bytes more to rank 1, one message more)."""
    seen = world[0]
    assert seen["in flight"]
    assert seen["counters"]["got"] == seen["counters"]["want"]
    assert seen["counters"]["control"] > 0
