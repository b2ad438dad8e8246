"""Run one command per emulated host with torchrun's environment; fail fast, clean up always.

The contract is torchrun's: every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (plus GLOO_SOCKET_IFNAME), so a script that runs here runs unchanged
under ``torchrun`` on a real cluster. Each emulated host is its own node, so LOCAL_RANK is 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gradwire.cluster import Cluster
from gradwire.errors import GradwireError

MASTER_PORT = 29500
# glibc's allocator, for every rank unless GLIBC_TUNABLES is set (an empty value keeps glibc's
# defaults): buffers of more than 32 MiB come from mmap, page-faulted afresh at every
# allocation, so a rank that allocates a gradient-sized tensor per call pays 25 000 faults
# of 4 KiB per 100 MB each time (x.abs() of 25.6 M fp32 took 100.6 ms into a fresh tensor,
# 21.8 ms into an existing one). hugetlb=1 has malloc ask for transparent huge pages (where
# the kernel leaves them to madvise): 2 MiB faults, and the same call took 30.3 ms, after a
# slower first one (medians, benchmarks/results/malloc_ab.json). Raising the mmap and trim
# thresholds as well (freed memory kept for reuse) was erratic here, 14-230 ms, and is not
# set. C libraries other than glibc, and glibc before 2.35, ignore the setting.
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"
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


@contextlib.contextmanager
def _loopback_store() -> Iterator[tuple[int, dict[str, str]]]:
    """The rendezvous store for ranks on 127.0.0.1, served by the launcher on 127.0.0.1 only.

    Left to itself, rank 0's TCPStore listens on every interface of the machine (``*:port``,
    measured with ``ss -ltn``); ranks inside a namespace reach only the emulated subnet, but
    on the loopback fallback that would open the store to the network. As torchrun's agent
    does, the launcher serves the store itself (on a socket it bound to 127.0.0.1) and the
    ranks connect as clients (TORCHELASTIC_USE_AGENT_STORE).
    """
    from torch.distributed import TCPStore

    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    # The store owns the listening socket from here and closes it when collected.
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     master_listen_fd=sock.detach())
    try:
        yield port, {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    finally:
        del store


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
        # NCCL as gloo: bound to the host's link. NCCL takes ranks with one host hash for one
        # machine (shared memory between them, and two ranks may not share a GPU: "Duplicate
        # GPU detected", benchmarks/results/nccl.json); each emulated host is its own machine,
        # so each gets its own id and NCCL connects the ranks over sockets, as between hosts.
        "NCCL_SOCKET_IFNAME": host.ifname,
        "NCCL_HOSTID": f"gradwire-{cluster.name}-host{rank}",
        "GRADWIRE_NETWORK": cluster.label,
        "GRADWIRE_IFNAME": host.ifname,
        "PYTHONUNBUFFERED": "1",
        # One intra-op thread a rank: more ranks than cores already contend for the CPU.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", MALLOC_TUNABLES),
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
    linger: float = 0.0,
) -> RunResult:
    """Start ``cmd`` once per host, stream output with a ``[rank i]`` prefix, and wait.

    If a rank fails, the others are stopped (SIGTERM, then SIGKILL after a grace period) and the
    result names the first rank that failed and how. ``linger``: seconds the others get first
    to fail on their own (their errors then name the peer they lost); the fault tests use it
    to prove that no rank hangs. ``timeout`` bounds the whole run.
    """
    if not cmd:
        raise GradwireError("no command given: expected `gradwire run ... -- CMD ARGS...`")
    if timeout is not None and timeout <= 0:
        raise GradwireError(f"--timeout must be a positive number of seconds, got {timeout}")
    if sink is None:
        def sink(line: str) -> None:
            print(line, flush=True)
    store = (_loopback_store() if cluster.hosts[0].netns is None
             else contextlib.nullcontext((MASTER_PORT, {})))
    with store as (port, store_env):
        return _start(cluster, cmd, timeout, sink, {**store_env, **(extra_env or {})}, linger,
                      port)


def _start(cluster: Cluster, cmd: Sequence[str], timeout: float | None,
           sink: Callable[[str], None], extra_env: dict[str, str], linger: float,
           port: int) -> RunResult:
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    width = len(str(len(cluster.hosts) - 1))
    try:
        for host in cluster.hosts:
            env = dict(os.environ)
            env.update(rank_env(cluster, host.rank, port))
            env.update(extra_env)
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
        return _wait(procs, timeout, linger)
    finally:
        _stop(procs)
        for t in threads:
            t.join(timeout=2)


def _wait(procs: list[subprocess.Popen], timeout: float | None, linger: float) -> RunResult:
    deadline = None if timeout is None else time.monotonic() + timeout
    stop_at, first = 0.0, None  # the first failure seen (a rank killed by a signal before
    # ranks that exited with an error at the same poll) and when its linger ends
    while True:
        codes = [p.poll() for p in procs]
        exits = [RankExit(i, c) for i, c in enumerate(codes)]
        failed = [e for e in exits if e.returncode not in (None, 0)]
        if failed and first is None:
            first = min(failed, key=lambda e: (e.returncode or 0) > 0)
            stop_at = time.monotonic() + linger
        if first is not None and (None not in codes or time.monotonic() >= stop_at):
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
