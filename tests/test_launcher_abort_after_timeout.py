"""A rank whose gloo all_reduce timed out in a world of 3 often ends by SIGABRT after its one
line ("terminate called without an active exception" as it exits): about 1 run of 3 where a
rank stalled in the worker's epoch's sums. The launcher named that rank as killed, in place
of the rank that stalled; it now reads it as a rank that timed out waiting. A rank killed
otherwise, or one that aborted without saying it timed out, is still named as killed."""

from __future__ import annotations

import sys
import time

from test_launcher_unnamed_stall import _decide

from gradwire.cluster import loopback_cluster
from gradwire.launcher import launch

SUMS = "the epoch's sums after epoch 1"


def _timeout_line(rank: int) -> str:
    """The worker's last line where its all_reduce timed out among 3 ranks."""
    from gradwire.train import worker
    from gradwire.transport import collective_error

    gloo = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
            "waiting 2000ms for recv operation to complete")
    e = collective_error(rank, 3, "all_reduce", gloo, 2.0, SUMS, worker.LATE)
    return f"gradwire train: error: {e}"


STALLED = ("rank 1 stalled (ranks 0, 2 timed out in a collective waiting for it); stopped the "
           "other ranks")


def test_a_rank_that_aborts_after_its_timeout_waited_for_the_stalled_rank():
    lines = {0: _timeout_line(0), 2: _timeout_line(2) + "\nterminate called without an "
             "active exception"}
    assert _decide([1, None, -6], lines) == STALLED
    assert _decide([-6, None, -6], lines | {0: _timeout_line(0)}) == STALLED


def test_other_signals_and_an_abort_without_a_timeout_are_still_a_killed_rank():
    lines = {0: _timeout_line(0), 2: _timeout_line(2)}
    assert _decide([1, None, -9], lines) == ("rank 2 was killed by SIGKILL; stopped the other "
                                             "ranks")
    assert _decide([1, None, -6], {0: lines[0]}) == ("rank 2 was killed by SIGABRT; stopped the "
                                                     "other ranks")


# Rank 1 stalls; rank 2 times out first and aborts, rank 0 times out a moment later and exits
# with its error: the launcher waits for rank 0 (GRADWIRE_TIMEOUT) as it does after a rank
# that exited with its timeout, then names rank 1.
RANKS = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(60)
time.sleep(0.5 if rank == 2 else 2.0)
print(LINES[rank], flush=True)
if rank == 2:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file where cores are kept
    os.abort()
sys.exit(1)
"""


def test_the_launcher_names_the_stalled_rank_when_the_first_to_fail_aborted():
    lines: list[str] = []
    t0 = time.monotonic()
    script = f"LINES = {[_timeout_line(r) for r in range(3)]!r}\n{RANKS}"
    res = launch(loopback_cluster(3), [sys.executable, "-c", script], timeout=60,
                 sink=lines.append, extra_env={"GRADWIRE_TIMEOUT": "20"})
    assert res.message == STALLED, lines
    assert res.returncode == 1
    assert time.monotonic() - t0 < 30, lines  # not the stalled rank's 60 s
