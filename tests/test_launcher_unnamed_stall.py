"""In a world of 3 or more, gloo does not say which rank a collective lost: where every rank
but one ends with a collective's timeout that names no rank and that one still runs, the
launcher names it as stalled, not the first rank that waited for it; a rank that exited, a
crash, or two ranks still running leave the launcher's line as it was."""

import io
import sys

from hypothesis import given
from hypothesis import strategies as st
from test_checkpoint_timeout_reap_lock import COLLECTIVE_S
from test_worker_lost_peer import STALLS

from gradwire.cluster import loopback_cluster
from gradwire.launcher import (
    RankExit,
    _failure,
    _Output,
    _stalled,
    launch,
    peer_lost,
    unnamed_timeout,
)

GLOO_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                "waiting 5000ms for recv operation to complete")
GLOO_CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
               "by peer [127.0.0.1]:5009.")
SUMS = "the epoch's sums after epoch 1"


def _worker_line(rank: int, world: int, gloo: str) -> str:
    """The line the worker's entry point ends ``rank`` with where gloo failed with ``gloo``
    in the epoch's sums (:func:`gradwire.train.worker._collective`)."""
    from gradwire.train import worker
    from gradwire.transport import collective_error

    e = collective_error(rank, world, "all_reduce", gloo, 5.0, SUMS, worker.LATE)
    return f"gradwire train: error: {e}"


def _decide(codes: list[int | None], lines: dict[int, str]) -> str:
    """The launcher's line for ranks that ended with ``codes`` (None: still running) after
    printing ``lines``, the first of them (a killed one before the others) taken as first."""
    output = _Output(lambda line: None, len(codes))
    for rank, text in lines.items():
        output.follow(rank, io.StringIO(text + "\n"))
    output.close()
    exits = [RankExit(r, c) for r, c in enumerate(codes)]
    failed = [e for e in exits if e.returncode not in (None, 0)]
    first = min(failed, key=lambda e: (e.returncode or 0) > 0)
    return _failure(first, _stalled(exits, output.lost, output.timed_out), exits).message


def test_the_launcher_names_a_rank_that_stalls_in_a_collective_of_the_worker_among_three():
    """Rank 1 stalls before the barrier at the start of epoch 2; ranks 0 and 2 time out there,
    each in a line that names no rank: the launcher names rank 1, where it named rank 0, a
    rank that waited."""
    lines: list[str] = []
    res = launch(loopback_cluster(3), [sys.executable, "-c", STALLS], timeout=60,
                 sink=lines.append, extra_env={"GRADWIRE_TIMEOUT": "10"})
    assert res.message == ("rank 1 stalled (ranks 0, 2 timed out in a collective waiting for "
                           "it); stopped the other ranks"), lines
    assert res.returncode == 1
    for r in (0, 2):
        assert (f"[rank {r}] gradwire train: error: rank {r} in the start of epoch 2: barrier "
                f"timed out after {COLLECTIVE_S:g} s: a rank stalled or its link is down (the "
                "worker's --timeout or GRADWIRE_TIMEOUT sets the limit); gloo does not say "
                "which") in lines, lines


def test_the_pattern_reads_the_rank_from_the_workers_timeout_and_nothing_else():
    """UNNAMED_TIMEOUT, held against the messages the worker's collectives make: a timeout in
    a world of 3 gives the rank that failed, however it is shown; a closed connection (a rank
    that exited) and a world of 2's PeerError (read by PEER_LOST) give none."""
    line = _worker_line(2, 3, GLOO_TIMEOUT)
    assert unnamed_timeout(line) == 2 and peer_lost(line) is None
    assert unnamed_timeout("gradwire.errors.GradwireError: " + line.partition(": error: ")[2]) == 2
    assert unnamed_timeout(_worker_line(2, 3, GLOO_CLOSED)) is None
    named = _worker_line(1, 2, GLOO_TIMEOUT)
    assert unnamed_timeout(named) is None and peer_lost(named) == (1, 0)


def test_every_rank_but_the_running_one_timed_out_names_it():
    lines = {0: _worker_line(0, 4, GLOO_TIMEOUT), 1: _worker_line(1, 4, GLOO_TIMEOUT),
             3: _worker_line(3, 4, GLOO_TIMEOUT)}
    assert _decide([1, 1, None, 1], lines) == ("rank 2 stalled (ranks 0, 1, 3 timed out in a "
                                               "collective waiting for it); stopped the other "
                                               "ranks")
    assert _decide([None, 1, 1], {r: _worker_line(r, 3, GLOO_TIMEOUT) for r in (1, 2)}) == (
        "rank 0 stalled (ranks 1, 2 timed out in a collective waiting for it); stopped the "
        "other ranks")


def test_a_rank_that_was_killed_is_named_as_killed_not_as_stalled():
    """Rank 1 was killed; rank 0 found its connection closed (a line that names no rank) and
    rank 2 still runs: rank 1 is the one the line names."""
    lines = {0: _worker_line(0, 3, GLOO_CLOSED)}
    assert _decide([1, -9, None], lines) == "rank 1 was killed by SIGKILL; stopped the other ranks"
    # a closed connection is never a stall, even where one rank still runs
    assert _decide([1, 1, None], {0: lines[0], 1: _worker_line(1, 3, GLOO_CLOSED)}) == (
        "rank 0 exited with status 1; stopped the other ranks")


def test_two_ranks_running_or_a_crash_among_the_timeouts_names_the_first_rank():
    timeout = {r: _worker_line(r, 4, GLOO_TIMEOUT) for r in range(4)}
    assert _decide([1, 1, None, None], {0: timeout[0], 1: timeout[1]}) == (
        "rank 0 exited with status 1; stopped the other ranks")
    crash = {0: "ValueError: mat1 and mat2 shapes cannot be multiplied", 1: timeout[1],
             3: timeout[3]}
    assert _decide([1, 1, None, 1], crash) == "rank 0 exited with status 1; stopped the other ranks"
    # a rank that timed out, then was killed by a signal, is a killed rank; one that aborted
    # as it exited timed out (tests/test_launcher_abort_after_timeout.py)
    assert _decide([1, -9, None], {0: timeout[0], 1: timeout[1]}) == (
        "rank 1 was killed by SIGKILL; stopped the other ranks")
    # a rank that exited 0 may be the one the others waited for
    assert _decide([1, 0, None], {0: timeout[0]}) == (
        "rank 0 exited with status 1; stopped the other ranks")


def test_a_named_peer_keeps_its_reading():
    """Ranks that name the peer they lost are read as before, whatever the others say."""
    from gradwire.transport import peer_error

    named = {r: f"gradwire.errors.PeerError: {peer_error(r, 'recv', 1, 8, 'timed out', 5.0)}"
             for r in (0, 2)}
    assert _decide([1, None, 1], named) == ("rank 1 stalled (ranks 0, 2 lost it); stopped the "
                                            "other ranks")
    mixed = {0: named[0], 2: _worker_line(2, 3, GLOO_TIMEOUT)}
    assert _decide([1, None, 1], mixed) == "rank 0 exited with status 1; stopped the other ranks"


CODES = st.one_of(st.none(), st.sampled_from([0, 1, 2, -9, -15, -6]))


@given(codes=st.lists(CODES, min_size=1, max_size=6), data=st.data())
def test_a_stall_is_a_running_rank_that_every_failed_rank_waited_for(codes, data):
    """Whatever the ranks' ends and lines: a rank named as stalled still runs, the ranks
    named as waiting for it are exactly those that failed, and a stall read from unnamed
    timeouts needs every other rank to have exited with an error after one."""
    n = len(codes)
    ranks = st.integers(0, n - 1)
    lost = data.draw(st.dictionaries(ranks, ranks))
    timed_out = data.draw(st.sets(ranks))
    exits = [RankExit(r, c) for r, c in enumerate(codes)]
    stall = _stalled(exits, lost, timed_out)
    failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
    if stall is None:
        return
    assert codes[stall.rank] is None and stall.losers == failed and stall.rank not in failed
    if stall.how != "lost it":
        assert codes.count(None) == 1 and len(failed) == n - 1
        assert all(codes[r] in (-6, *range(1, 256)) and r in timed_out and r not in lost
                   for r in failed)
