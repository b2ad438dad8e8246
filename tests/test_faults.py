"""Faults: a rank killed mid-collective, a link taken down mid-run. Every surviving rank must
fail on its own, within a bound, naming a peer and the collective; nothing may be left behind.
Mismatched calls and NaN/Inf: tests/scripts/agree_check.py (run below)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS, gradwire_leftovers, needs_netns, run_checks, script

from gradwire.cluster import ephemeral_cluster, loopback_cluster
from gradwire.launcher import launch

TIMEOUT = 4  # GRADWIRE_TIMEOUT for the ranks: a link down is detected by this timeout


@needs_netns
def test_twenty_random_kills_on_the_emulated_cluster():
    """20 seeded trials (algorithm, P, victim, kill time) on one 4-host 1 Gbit/s cluster; see
    tests/scripts/fault_trials.py. Nothing of the cluster is left afterwards."""
    p = subprocess.run([sys.executable, str(SCRIPTS / "fault_trials.py")], capture_output=True,
                       text=True, timeout=300, env={**_env(), "TRIALS": "20", "SEED": "7",
                                                    "CLUSTER": "emulated"})
    out = p.stdout + p.stderr
    assert "TRIALS trials=20 cluster=emulated" in out and "failures=0" in out, out[-3000:]
    assert p.returncode == 0, out[-3000:]
    name = re.search(r"CLUSTER (gw[0-9a-f]{6})", out).group(1)
    assert gradwire_leftovers(name) == []


def test_mismatched_calls_and_nan_policy_on_every_rank():
    """tests/scripts/agree_check.py: mismatches, NaN/Inf, a skipped last call; P = 3."""
    run_checks("agree_check.py", 3, timeout=120)


def _env() -> dict[str, str]:
    return {**os.environ, "GRADWIRE_TIMEOUT": str(TIMEOUT)}


def _errors(lines: list[str]) -> dict[int, tuple[int, str]]:
    """rank -> (peer it named, message) from PEERERROR lines."""
    out = {}
    for line in lines:
        m = re.match(r"\[rank\s*(\d+)\] PEERERROR (\d+) (.*)", line)
        if m:
            out[int(m[1])] = (int(m[2]), m[3])
    return out


def _ranks_gone(token: str) -> bool:
    return subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 1


@needs_netns
@pytest.mark.parametrize("kind", ["ring", "gtopk"])
def test_killed_rank_on_the_emulated_cluster(kind):
    """P = 3 at 1 Gbit/s: rank 1 SIGKILLs itself mid-collective; ranks 0 and 2 exit 3 on their
    own (PeerError naming a peer and the collective), the launcher names rank 1."""
    with ephemeral_cluster(3, "1gbit") as c:
        lines: list[str] = []
        start = time.monotonic()
        res = launch(c, script("fault_rank.py"), timeout=90, sink=lines.append,
                     extra_env={"KIND": kind, "KILL_RANK": "1", "KILL_AFTER": "0.3",
                                "GRADWIRE_TIMEOUT": str(TIMEOUT)}, linger=3 * TIMEOUT)
        took = time.monotonic() - start
        name = c.name
    assert res.message.startswith("rank 1 was killed by SIGKILL"), res.message
    assert [e.returncode for e in res.exits] == [3, -9, 3], "\n".join(lines[-20:])
    errors = _errors(lines)
    assert set(errors) == {0, 2} and 1 in {peer for peer, _ in errors.values()}, errors
    label = "allreduce/ring" if kind == "ring" else "gtopk"
    assert all(label in msg and f"rank {peer}" in msg for peer, msg in errors.values()), errors
    assert took < 60
    assert gradwire_leftovers(name) == [] and _ranks_gone("fault_rank.py")


@needs_netns
def test_link_down_mid_run_is_a_timeout_naming_the_peer():
    """Host 2's link goes down while ranks loop a ring allreduce: no rank hangs; the ranks
    waiting on rank 2 time out naming it."""
    with ephemeral_cluster(3, "1gbit") as c:
        lines: list[str] = []

        def sink(line: str) -> None:
            lines.append(line)
            if sum("READY" in x for x in lines) == 3 and not downed:
                downed.append(subprocess.run(["ip", "link", "set", f"{c.name}-v2", "down"],
                                             capture_output=True).returncode)

        downed: list[int] = []
        start = time.monotonic()
        res = launch(c, script("fault_rank.py"), timeout=90, sink=sink,
                     extra_env={"KIND": "ring", "GRADWIRE_TIMEOUT": str(TIMEOUT)},
                     linger=3 * TIMEOUT)
        took = time.monotonic() - start
        name = c.name
    assert downed == [0]
    assert all(e.returncode == 3 for e in res.exits), "\n".join(lines[-20:])
    errors = _errors(lines)
    assert set(errors) == {0, 1, 2} and all("allreduce/ring" in m for _, m in errors.values())
    # Ranks waiting on rank 2 time out naming it; a rank whose own peer exited first may
    # see that connection close instead.
    assert any(peer == 2 and "timed out" in m for peer, m in errors.values()), errors
    assert all("timed out" in m or "connection closed" in m for _, m in errors.values())
    assert took < 60
    assert gradwire_leftovers(name) == [] and _ranks_gone("fault_rank.py")


def test_hook_builtin_collectives_are_bounded_and_named(monkeypatch):
    """The hooks' torch.distributed path waits GRADWIRE_TIMEOUT, not the process group's 30
    minutes, and says so in one line (the stall itself: docs/reliability.md, measured)."""
    from types import SimpleNamespace

    from gradwire.errors import GradwireError
    from gradwire.hooks.comm import Comm

    seen = []

    class Work:
        def wait(self, timeout):
            seen.append(timeout.total_seconds())
            raise RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out\nmore")

    monkeypatch.setenv("GRADWIRE_TIMEOUT", "7")
    comm = SimpleNamespace(transport=None, rank=3)
    with pytest.raises(GradwireError, match=r"^rank 3: torch.distributed all_reduce of 4 "
                                            r"elements failed or timed out after 7 s .*Timed out$"):
        Comm._bounded(comm, Work(), "all_reduce of 4 elements")
    assert seen == [7.0]


# fault_rank.py, after printing its pid, so that the test can stop one rank from outside
WITH_PID = ("import os, runpy, sys; print('PID', os.getpid(), flush=True); "
            "runpy.run_path(sys.argv[1], run_name='__main__')")


def test_a_stalled_rank_is_named_by_the_launcher():
    """3 ranks loop a ring allreduce on loopback; rank 1 gets SIGSTOP. Each survivor fails
    naming rank 1 or a survivor that waits on it (the ring's order and the header exchange
    decide which): the final line names the stalled rank, not the first survivor to fail, and
    the stopped rank is stopped too."""
    p, stalled = 3, 1
    lines: list[str] = []
    pids: dict[int, int] = {}

    def sink(line: str) -> None:
        lines.append(line)
        m = re.match(r"\[rank (\d+)\] PID (\d+)", line)
        if m:
            pids[int(m[1])] = int(m[2])
        if sum(x.endswith("] READY") for x in lines) == p and line.endswith("] READY"):
            os.kill(pids[stalled], signal.SIGSTOP)

    start = time.monotonic()
    cmd = [sys.executable, "-c", WITH_PID, str(SCRIPTS / "fault_rank.py")]
    res = launch(loopback_cluster(p), cmd, timeout=60, sink=sink,
                 extra_env={"KIND": "ring", "GRADWIRE_TIMEOUT": "2"})
    took = time.monotonic() - start
    survivors = ", ".join(str(r) for r in range(p) if r != stalled)
    assert res.message == (f"rank {stalled} stalled (ranks {survivors} lost it); stopped the "
                           "other ranks"), "\n".join(lines[-20:])
    assert res.returncode == 3
    assert took < 30
    for pid in pids.values():  # reaped, the stopped one included
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
