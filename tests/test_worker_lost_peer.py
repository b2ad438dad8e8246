"""A training rank whose peer exits or stalls in one of the worker's own collectives (outside
the hook: DDP's set-up and forward, the barriers, the epoch's sums, the checkpoint's gather)
ends in one line saying which step it was in and, where gloo lets it be known, which rank it
lost, in the form the launcher reads; gloo's traceback before."""

import datetime
import functools
import itertools
import os
import sys
import time
from pathlib import Path

import pytest
from test_checkpoint_timeout_reap_lock import COLLECTIVE_S, _world

from gradwire.cluster import loopback_cluster
from gradwire.errors import GradwireError, PeerError
from gradwire.launcher import launch, peer_lost

# A short run: 2 epochs of a few iterations each
ARGS = ["--epochs", "2", "--batch-size", "64", "--no-warmup", "--timeout", f"{COLLECTIVE_S:g}"]
CLOSED = "failed: the connection closed (rank {} exited or was killed)"


def _calls(real, reached, nth: int = 1, after: bool = False):
    """``real``, calling ``reached()`` before its ``nth`` call (``after``: once it returns)."""
    count = itertools.count(1)

    @functools.wraps(real)
    def call(*args, **kwargs):
        n = next(count)
        if n == nth and not after:
            reached()
        out = real(*args, **kwargs)
        if n == nth and after:
            reached()
        return out
    return call


def _at(point: str, reached) -> None:
    """Have the worker call ``reached()`` at ``point`` of a run (this spawned rank's own
    modules, patched)."""
    import torch.distributed as dist

    from gradwire.train import worker

    if point == "ddp":  # DDP's set-up
        worker.HookedDDP.start = _calls(worker.HookedDDP.start, reached)
    elif point in ("start", "epoch"):  # the barrier before training, or before epoch 2
        dist.barrier = _calls(dist.barrier, reached, nth=1 if point == "start" else 3)
    elif point == "training":  # after the second step: the third forward broadcasts buffers
        real = worker.optimizer

        def optimizer(*args, **kwargs):
            opt = real(*args, **kwargs)
            opt.step = _calls(opt.step, reached, nth=2, after=True)
            return opt
        worker.optimizer = optimizer
    elif point == "sums":  # the epoch's sums
        worker.train_epoch = _calls(worker.train_epoch, reached, after=True)
    elif point == "save":  # the checkpoint's gather of every rank's aggregation state
        worker.HookedDDP.state_dict = _calls(worker.HookedDDP.state_dict, reached)


def _train(point: str, victim: int, how: str, extra: tuple, rank: int, world: int,
           out: str) -> dict:
    """worker.train() of a short run on this spawned rank. At ``point`` the ``victim`` rank
    exits ('exit') or stalls until every other rank has answered ('stall'); for a stall the
    others shorten the collective timeout to COLLECTIVE_S there (until then it is long, so
    that ranks a loaded machine keeps seconds apart do not fail before it). What train()
    raised here, and the seconds from the point to it."""
    import torch.distributed as dist

    from gradwire.train import worker

    dist.group.WORLD.set_timeout(datetime.timedelta(seconds=30))
    seen: dict = {}

    def reached() -> None:
        if rank != victim:
            seen["t"] = time.monotonic()
            if how == "stall":  # an exit is seen at once: a short limit would race with it
                dist.group.WORLD.set_timeout(datetime.timedelta(seconds=COLLECTIVE_S))
            return
        if how == "stall":
            end = time.monotonic() + 30
            while (not all(Path(out, f"rank{r}.json").exists() for r in range(world)
                           if r != victim) and time.monotonic() < end):
                time.sleep(0.05)
        os._exit(9)

    _at(point, reached)
    try:
        worker.train(worker.parse_args([*ARGS, *extra]))
        did = "ok"
    except BaseException as e:  # noqa: BLE001 - gloo's RuntimeError before
        did = f"{type(e).__name__}: {e}"
    return {"did": did, "s": time.monotonic() - seen.get("t", 0.0)}


@pytest.mark.parametrize("point,victim,model,step", [
    ("ddp", 1, "mlp-small", "DDP's set-up of the model: collective with"),
    ("start", 1, "mlp-small", "the start of training: barrier with"),
    ("epoch", 1, "mlp-small", "the start of epoch 2: barrier with"),
    ("training", 0, "resnet20", "epoch 1's training: collective with"),
    ("sums", 1, "mlp-small", "the epoch's sums after epoch 1: all_reduce with"),
    ("save", 1, "mlp-small", "the checkpoint save: gather_object with"),
])
def test_a_peer_that_exits_in_a_collective_of_the_worker_is_named_in_one_line(
        tmp_path, point, victim, model, step):
    """Rank ``victim`` exits as it reaches ``point``: the other rank ends at once in one line
    naming the step and the rank it lost, which the launcher reads."""
    extra = ("--model", model, *(("--checkpoint", str(tmp_path / "ck.pt"))
                                 if point == "save" else ()))
    seen = _world(functools.partial(_train, point, victim, "exit", extra), 2, tmp_path)
    survivor = 1 - victim
    assert list(seen) == [survivor], seen
    did = seen[survivor]["did"]
    assert did == (f"PeerError: rank {survivor} in {step} rank {victim} "
                   f"{CLOSED.format(victim)}"), did
    assert peer_lost(did) == (survivor, victim)
    assert seen[survivor]["s"] < 10, seen


def test_a_peer_that_stalls_in_the_epochs_sums_is_named_within_the_timeout(tmp_path):
    """Rank 1 stalls before the epoch's sums: rank 0 gives up after the collective timeout,
    in one line naming rank 1 as stalled, as the launcher reads it."""
    seen = _world(functools.partial(_train, "sums", 1, "stall", ("--model", "mlp-small")), 2,
                  tmp_path)
    assert list(seen) == [0], seen
    did = seen[0]["did"]
    assert did == (f"PeerError: rank 0 in the epoch's sums after epoch 1: all_reduce with rank 1 "
                   f"timed out after {COLLECTIVE_S:g} s: rank 1 stalled or its link is down (the "
                   "worker's --timeout or GRADWIRE_TIMEOUT sets the limit)"), did
    assert peer_lost(did) == (0, 1)
    assert COLLECTIVE_S - 0.2 < seen[0]["s"] < COLLECTIVE_S + 5, seen


@pytest.mark.parametrize("gloo,why", [
    ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
     "[127.0.0.1]:5009.", "failed: the connection closed (a rank exited or was killed)"),
    ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
     "60000ms for recv operation to complete",
     "timed out after 60 s: a rank stalled or its link is down (the worker's --timeout or "
     "GRADWIRE_TIMEOUT sets the limit)"),
])
def test_in_a_larger_world_the_error_says_gloo_does_not_name_the_rank(gloo, why):
    """Gloo does not say which rank a collective lost: in a world of three the error says
    so, in one line, and names no rank for the launcher to take as lost."""
    from gradwire.train import worker
    from gradwire.transport import collective_error

    e = collective_error(2, 3, "all_reduce", gloo, 60.0, "the epoch's sums after epoch 4",
                         worker.LATE)
    assert type(e) is GradwireError and not isinstance(e, PeerError)
    assert str(e) == (f"rank 2 in the epoch's sums after epoch 4: all_reduce {why}; gloo does "
                      "not say which")
    assert peer_lost(str(e)) is None


def test_an_error_of_the_ranks_own_in_a_collectives_step_passes_unchanged():
    """Only gloo's errors are a lost peer: the model's own (a shape torch refuses) is this
    rank's fault and goes on as it was."""
    from gradwire.train import worker

    with pytest.raises(RuntimeError, match="^mat1 and mat2 shapes cannot be multiplied$"):
        with worker._collective("collective", "epoch 1's training", 60.0):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


# Rank 1 stalls before the start of epoch 2's barrier; rank 0 waits COLLECTIVE_S for it there
# and ends as the worker's entry point ends a rank.
STALLS = f"""
import datetime, os, sys, time
import torch.distributed as dist
from gradwire.train import worker

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
dist.barrier()
dist.group.WORLD.set_timeout(datetime.timedelta(seconds={COLLECTIVE_S}))
if os.environ["RANK"] == "1":
    time.sleep(60)

def main():
    with worker._collective("barrier", "the start of epoch 2", {COLLECTIVE_S}):
        dist.barrier()

worker.main = main
sys.exit(worker._main())
"""


def test_the_launcher_names_a_rank_that_stalls_in_a_barrier_of_the_worker():
    """The launcher reads the lost peer from the worker's one line and names the stalled
    rank, not the rank that waited for it."""
    lines: list[str] = []
    t0 = time.monotonic()
    res = launch(loopback_cluster(2), [sys.executable, "-c", STALLS], timeout=60,
                 sink=lines.append)
    assert res.message == "rank 1 stalled (rank 0 lost it); stopped the other ranks", lines
    assert ("[rank 0] gradwire train: error: rank 0 in the start of epoch 2: barrier with rank 1 "
            f"timed out after {COLLECTIVE_S:g} s: rank 1 stalled or its link is down (the "
            "worker's --timeout or GRADWIRE_TIMEOUT sets the limit)") in lines, lines
    assert time.monotonic() - t0 < 30
