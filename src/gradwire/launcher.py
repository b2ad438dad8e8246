"""Run one command per emulated host with torchrun's environment; fail fast, clean up always.

The contract is torchrun's: every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (plus GLOO_SOCKET_IFNAME), so a script that runs here runs unchanged
under ``torchrun`` on a real cluster. Each emulated host is its own node, so LOCAL_RANK is 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gradwire.cluster import Cluster
from gradwire.errors import GradwireError

MASTER_PORT = 29500
PROGRESS = "GW_PROGRESS"  # rank programs print "GW_PROGRESS done total" for a progress bar
KILL_GRACE_S = 3.0


@dataclass
class RankExit:
    rank: int
    returncode: int | None  # None: still running when stopped

    def describe(self) -> str:
        rc = self.returncode
        if rc is None:
            return f"rank {self.rank} was still running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"rank {self.rank} was killed by {name}"
        return f"rank {self.rank} exited with status {rc}"


@dataclass
class RunResult:
    """How a launch ended: ``returncode`` is 0 only when every rank exited 0 in time."""

    returncode: int
    message: str
    exits: list[RankExit]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(cluster: Cluster, rank: int, port: int) -> dict[str, str]:
    """The environment torchrun would give ``rank`` on this cluster."""
    host = cluster.hosts[rank]
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(len(cluster.hosts)),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": cluster.hosts[0].addr,
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": host.ifname,
        "GRADWIRE_NETWORK": cluster.label,
        "GRADWIRE_IFNAME": host.ifname,
        "PYTHONUNBUFFERED": "1",
        # One intra-op thread a rank: more ranks than cores already contend for the CPU.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _stream(prefix: str, pipe, sink: Callable[[str], None]) -> None:
    for line in iter(pipe.readline, ""):
        sink(f"{prefix}{line.rstrip()}")
    pipe.close()


def launch(
    cluster: Cluster,
    cmd: Sequence[str],
    timeout: float | None = None,
    sink: Callable[[str], None] | None = None,
    extra_env: dict[str, str] | None = None,
) -> RunResult:
    """Start ``cmd`` once per host, stream output with a ``[rank i]`` prefix, and wait.

    If a rank fails, the others are stopped (SIGTERM, then SIGKILL after a grace period) and the
    result names the first rank that failed and how. ``timeout`` bounds the whole run.
    """
    if not cmd:
        raise GradwireError("no command given: expected `gradwire run ... -- CMD ARGS...`")
    if timeout is not None and timeout <= 0:
        raise GradwireError(f"--timeout must be a positive number of seconds, got {timeout}")
    if sink is None:
        def sink(line: str) -> None:
            print(line, flush=True)
    port = _free_port() if cluster.hosts[0].netns is None else MASTER_PORT
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    width = len(str(len(cluster.hosts) - 1))
    try:
        for host in cluster.hosts:
            env = dict(os.environ)
            env.update(rank_env(cluster, host.rank, port))
            env.update(extra_env or {})
            argv = list(cmd)
            if host.netns is not None:
                argv = ["ip", "netns", "exec", host.netns, *argv]
            try:
                p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     start_new_session=True)
            except OSError as e:
                raise GradwireError(f"cannot start {cmd[0]!r} for rank {host.rank}: {e}") from e
            procs.append(p)
            t = threading.Thread(target=_stream, args=(f"[rank {host.rank:>{width}}] ",
                                                        p.stdout, sink), daemon=True)
            t.start()
            threads.append(t)
        return _wait(procs, timeout)
    finally:
        _stop(procs)
        for t in threads:
            t.join(timeout=2)


def _wait(procs: list[subprocess.Popen], timeout: float | None) -> RunResult:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        exits = [RankExit(i, c) for i, c in enumerate(codes)]
        failed = [e for e in exits if e.returncode not in (None, 0)]
        if failed:
            first = failed[0]
            rc = first.returncode if first.returncode and first.returncode > 0 else 1
            return RunResult(rc, f"{first.describe()}; stopped the other ranks", exits)
        if all(c == 0 for c in codes):
            return RunResult(0, f"all {len(procs)} ranks exited 0", exits)
        if deadline is not None and time.monotonic() > deadline:
            running = [str(e.rank) for e in exits if e.returncode is None]
            return RunResult(124, f"timed out after {timeout:g} s; ranks still running: "
                             f"{', '.join(running)}", exits)
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every rank's process group, then SIGKILL what is left after a grace period."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        _signal_group(p, signal.SIGTERM)
    end = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < end and any(p.poll() is None for p in live):
        time.sleep(0.05)
    for p in procs:
        # The group may outlive its leader (a rank's own children): always sweep it.
        _signal_group(p, signal.SIGKILL)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            print(f"gradwire: pid {p.pid} did not exit after SIGKILL", file=sys.stderr)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
