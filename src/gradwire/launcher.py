"""Run one command per emulated host with torchrun's environment; fail fast, clean up always.

The contract is torchrun's: every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (plus GLOO_SOCKET_IFNAME), so a script that runs here runs unchanged
under ``torchrun`` on a real cluster. Each emulated host is its own node, so LOCAL_RANK is 0.

What the launcher reads in the ranks' output: ``GW_PROGRESS done total`` lines (for a progress
bar), and the message of a :class:`~gradwire.errors.PeerError` (``rank R ...: receive of N
bytes from rank P timed out ...``, ``rank R ...: all_reduce with rank P failed ...``) anywhere
in a line, a traceback's last line or a program's own report: when every rank that failed
lost one rank that is still running, directly or through ranks that lost it in turn, the
final line names that rank as stalled. So it does when every rank but one failed with a
collective's timeout whose lost rank gloo does not name (``rank R in STEP: all_reduce timed
out after T s: a rank ...; gloo does not say which``, a world of 3 or more) and that one
rank still runs.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from gradwire import config
from gradwire.cluster import Cluster
from gradwire.cluster.netns import call_in
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted, on_signals

# glibc's allocator, for every rank unless GLIBC_TUNABLES is set (an empty value keeps glibc's
# defaults): buffers of more than 32 MiB come from mmap, page-faulted afresh at every
# allocation, so a rank that allocates a gradient-sized tensor per call pays 25 000 faults
# of 4 KiB per 100 MB each time (x.abs() of 25.6 M fp32 took 100.6 ms into a fresh tensor,
# 21.8 ms into an existing one). hugetlb=1 has malloc ask for transparent huge pages (where
# the kernel leaves them to madvise): 2 MiB faults, and the same call took 30.3 ms, after a
# slower first one (medians, benchmarks/results/malloc_ab/latest.json). Raising the mmap and trim
# thresholds as well (freed memory kept for reuse) was erratic here, 14-230 ms, and is not
# set. C libraries other than glibc, and glibc before 2.35, ignore the setting.
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"
PROGRESS = "GW_PROGRESS"  # rank programs print "GW_PROGRESS done total" for a progress bar
KILL_GRACE_S = 3.0
OUTPUT_MAX_S = 60.0  # how long the ranks' output may still flow once they are all gone
DRAIN_S = 1.0  # how long the output of ranks that failed together may still flow, in all
# A PeerError's message (made by gradwire.transport): the rank that failed, then the peer it
# lost in a send, a receive or a collective ("barrier with rank 1 failed"). tests/test_launcher.py
# and tests/test_worker_lost_peer.py hold this pattern against the messages themselves.
PEER_LOST = re.compile(r"\brank (\d+)\b.*?: (?:send of \d+ bytes to|receive of \d+ bytes from|"
                       r"\w+ with) rank (\d+) (?:timed out|failed)")
# PEER_LOST's tail, on its own: PEER_LOST searched a whole line tries every "rank N" in it and
# scans the rest of the line from each, which took 2.1 s for a 64 kB line that named "rank 1"
# 8000 times (a rank's per-rank table on one line) and grew with the square of the length.
_PEER_OP = re.compile(r": (?:send of \d+ bytes to|receive of \d+ bytes from|\w+ with) "
                      r"rank \d+ (?:timed out|failed)")
# The error of a collective that timed out where gloo does not say which rank it lost (a world
# of 3 or more: gradwire.transport.collective_error), and the rank that failed: "rank 0 in
# the epoch's sums after epoch 1: all_reduce timed out after 5 s: a rank stalled or ...; gloo
# does not say which". A connection that closed ("failed: the connection closed (a rank
# exited or was killed); gloo does not say which") is a rank that exited, not a stall.
# tests/test_launcher_unnamed_stall.py holds this pattern against the message itself.
UNNAMED = "; gloo does not say which"
_UNNAMED_OP = re.compile(r": \w+ timed out after \S+ s: a rank [^;]*" + re.escape(UNNAMED))
UNNAMED_TIMEOUT = re.compile(r"\brank (\d+)\b.*?" + _UNNAMED_OP.pattern)
# _UNNAMED_OP up to its "[^;]*", and UNNAMED_TIMEOUT's "rank N": unnamed_timeout finds what
# UNNAMED_TIMEOUT does from these, in time linear in the line's length.
_UNNAMED_HEAD = re.compile(r": \w+ timed out after \S+ s: a rank ")
_RANK = re.compile(r"\brank (\d+)\b")


def _search(pattern: re.Pattern[str], tail: re.Pattern[str], line: str) -> re.Match[str] | None:
    """``pattern.search(line)``, where ``pattern`` is "rank N", a lazy scan, then ``tail``:
    the search stops at the end of the last ``tail``, so it scans the line once however many
    "rank N" it holds."""
    last = collections.deque(tail.finditer(line), maxlen=1)
    if not last:
        return None
    # Every "rank N" that can start a match lies before the end of the last tail, and from
    # each the lazy scan stops at the first tail after it: the search ends there.
    return pattern.search(line, 0, last[0].end())


def peer_lost(line: str) -> tuple[int, int] | None:
    """(the rank that failed, the peer it lost) where ``line`` holds a PeerError's message,
    as PEER_LOST finds them."""
    m = _search(PEER_LOST, _PEER_OP, line)
    return None if m is None else (int(m[1]), int(m[2]))


def unnamed_timeout(line: str) -> int | None:
    """The rank that failed where ``line`` holds the error of a collective that timed out
    waiting for a rank that gloo does not name: what UNNAMED_TIMEOUT's search finds.

    Not that search itself: its "[^;]*" scans from each "timed out after T s: a rank" to the
    next ";", so a line of many such before a ";" that is not UNNAMED's (or before none, the
    marker earlier in the line) took 0.14 s at 64 kB and 24 s at 1 MB, growing with the
    square of the length, while the reader thread left the rank's pipe unread. Here each part
    of the line is read once."""
    if UNNAMED not in line:  # most lines
        return None
    # Where a tail starts: a head whose next ";" begins UNNAMED (the heads cannot overlap, and
    # those that share a next ";" share its search).
    tails: list[int] = []
    semi = -1
    for m in _UNNAMED_HEAD.finditer(line):
        if semi < m.end():
            semi = line.find(";", m.end())
            if semi < 0:
                break
        if line.startswith(UNNAMED, semi):
            tails.append(m.start())
    if not tails:
        return None
    # The first "rank N" with a tail after it and no newline between (the lazy ".*?" does not
    # cross one): the nearest tail after it is the one to check, and moves only forward.
    at, newline = 0, -1
    for m in _RANK.finditer(line, 0, tails[-1]):
        while tails[at] < m.end():
            at += 1
        if newline < m.end():
            newline = line.find("\n", m.end())
            if newline < 0:
                newline = len(line)
        if newline >= tails[at]:
            return int(m[1])
    return None


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


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port on ``addr`` that no socket holds now (the system's pick), for a rendezvous
    (``tcp://127.0.0.1:PORT``, MASTER_PORT). Another process may take it before it is used:
    where that matters, bind and keep the socket, as the launcher's store does."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def rank_env(cluster: Cluster, rank: int, port: int) -> dict[str, str]:
    """The environment torchrun would give ``rank`` on this cluster."""
    host = cluster.hosts[rank]
    world = str(len(cluster.hosts))
    return {
        "RANK": str(rank),
        "WORLD_SIZE": world,
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        # torchrun's other names for the same: every host is a node (a group) of one worker, in
        # torchrun's one role, started once (no restarts), under its default run id.
        "GROUP_RANK": str(rank),
        "GROUP_WORLD_SIZE": world,
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": world,
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none",
        # Rank 0 serves the store, unless the launcher does (loopback: launch() sets "True").
        # Always set, as torchrun does: one inherited from a caller run under torchrun made
        # every rank a client of a store that nobody served.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        # Where torchrun's @record writes a rank's error for its agent; empty, as torchrun sets
        # it where it keeps no log files: the launcher reads the ranks' output instead. One
        # inherited from a caller run under torchrun had every rank overwrite that caller's
        # own error file with its error, which torchrun then reported as the caller's.
        "TORCHELASTIC_ERROR_FILE": "",
        "MASTER_ADDR": cluster.hosts[0].addr,
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": host.ifname,
        # NCCL as gloo: bound to the host's link. NCCL takes ranks with one host hash for one
        # machine (shared memory between them, and two ranks may not share a GPU: "Duplicate
        # GPU detected", benchmarks/results/nccl_check/latest.json); each emulated host is its
        # own machine, so each gets its own id and NCCL connects the ranks over sockets, as
        # between hosts.
        "NCCL_SOCKET_IFNAME": host.ifname,
        "NCCL_HOSTID": f"gradwire-{cluster.name}-host{rank}",
        # torchrun's: a failed or timed-out NCCL call aborts the communicator and ends the
        # rank, which the launcher then reports, instead of leaving it hung.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                          "1"),
        "GRADWIRE_NETWORK": cluster.label,
        "GRADWIRE_IFNAME": host.ifname,
        "PYTHONUNBUFFERED": "1",
        # One intra-op thread a rank: more ranks than cores already contend for the CPU.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", MALLOC_TUNABLES),
    }


def check_timeout(timeout: float | None) -> None:
    """Refuse a ``--timeout`` that cannot bound a run (nan, inf, 0, negative) in one line."""
    if timeout is not None:
        config.check_timeout("--timeout", timeout)


# Commands of a shell that no program on PATH provides: exec finds none of them (echo, test,
# kill, true and the like, found on PATH first, are taken as the programs they are there).
SHELL_BUILTINS = frozenset({
    ".", "alias", "bg", "builtin", "cd", "declare", "eval", "exec", "exit", "export", "fg",
    "hash", "history", "jobs", "let", "local", "popd", "pushd", "read", "readonly", "set",
    "shift", "source", "trap", "typeset", "ulimit", "umask", "unalias", "unset", "wait"})


def check_command(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line, a command that no rank could start (exec would not find it), before
    any cluster is built or rank started. Unchecked, a missing program would be a ``cannot
    start`` error on the loopback fallback and, in a namespace, each rank's ``exec of "X"
    failed`` line and exit status 1 once the cluster is built; and a torchrun user's
    ``train.py`` (torchrun puts python before a script) "No such file or directory" for a
    file that is there."""
    prog = os.fsdecode(cmd[0])  # a Path, as Popen takes one
    path = (os.environ if env is None else env).get("PATH", os.defpath)
    if os.sep in prog:
        found = prog if _executable(prog) else None
    else:  # an empty entry (PATH="", ":/usr/bin") is the current folder, as exec reads it
        dirs = os.pathsep.join(d or os.curdir for d in path.split(os.pathsep))
        found = shutil.which(prog, path=dirs) if prog else None
    if found is None:
        raise GradwireError(f"cannot start {prog!r}: {_not_startable(prog)}")
    head = _head(found)
    if not _is_program(head):
        # exec refuses it (Exec format error) on loopback; in a namespace, ip's execvp had
        # the shell run it, Python code included
        why = (_PYTHON_SCRIPT.format(prog=prog) if found.endswith(".py") else
               f"it has no #! line and is no program: give its interpreter (`-- sh {prog}`)")
        raise GradwireError(f"cannot start {prog!r}: {why}")
    interpreter = _missing_interpreter(head)
    if interpreter is not None:
        crlf = (" (the line ends in a Windows \\r: save the file with Unix line ends)"
                if interpreter.endswith("\r") else "")
        name = os.path.basename(interpreter.rstrip("\r"))
        name = name if name and shutil.which(name, path=path) else "INTERPRETER"
        raise GradwireError(f"cannot start {prog!r}: its #! line names {interpreter!r}, which "
                            f"is not a program here{crlf}; fix the line, or give an "
                            f"interpreter before it: `-- {name} {prog}`")


_PYTHON_SCRIPT = ("it is a Python script: the command is started as given (torchrun puts "
                  "python before a script); give `-- python {prog}`")


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _head(path: str) -> bytes | None:
    """The first line (at most 256 bytes) of the file at ``path``; None where it cannot be
    read (exec will say what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            return f.read(256).partition(b"\n")[0]
    except OSError:
        return None


def _is_program(head: bytes | None) -> bool:
    """Whether exec runs a file whose first line is ``head`` itself: a script with a ``#!``
    line or an ELF program (other formats the kernel was taught, binfmt_misc, are not told
    apart)."""
    return head is None or head.startswith(b"#!") or head[:4] == b"\x7fELF"


def _missing_interpreter(head: bytes | None) -> str | None:
    """The interpreter that the ``#!`` line ``head`` names where exec would not find it there
    as a program, else None. exec's error for it ("No such file or directory") names the
    script, which is there, and in a namespace each rank would say so and exit 1 once the
    cluster is built. Read as the kernel reads it: the first word after ``#!``, a Windows line end
    included, not looked up on PATH."""
    if head is None or not head.startswith(b"#!"):
        return None
    word = re.split(rb"[ \t\0]", head[2:].lstrip(b" \t"), maxsplit=1)[0]
    interpreter = os.fsdecode(word)
    return None if word and _executable(interpreter) else interpreter


def _not_startable(prog: str) -> str:
    """Why exec would not start ``prog``, and what to give instead."""
    if not prog:
        return "the command's name is empty"
    if os.path.isdir(prog):
        return "it is a folder, not a program"
    if os.path.isfile(prog):
        if prog.endswith(".py"):
            return _PYTHON_SCRIPT.format(prog=prog)
        if os.sep not in prog:
            run = (f"`./{prog}`" if os.access(prog, os.X_OK)
                   else f"`./{prog}` once `chmod +x {prog}`")
            return (f"it is not on PATH: the file of this folder is {run}, or give its "
                    f"interpreter: `-- sh {prog}`")
        return (f"the file is not executable: `chmod +x {prog}`, or give its interpreter: "
                f"`-- sh {prog}`")
    if prog in SHELL_BUILTINS:
        return f"it is a shell builtin, not a program: give `-- sh -c '{prog} ...'`"
    return "no such file" if os.sep in prog else "no such command on PATH"


def _print_line(line: str) -> None:
    text = line + "\n"  # one write: a print() writes the newline apart
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        # A stdout that cannot encode a character (PYTHONIOENCODING=ascii, a Latin-1 locale;
        # the U+FFFD that replaces a rank's bytes that are not UTF-8): escaped, not fatal. An
        # error here had ended the reader, closed the rank's pipe and killed it by SIGPIPE.
        encoding = getattr(sys.stdout, "encoding", None) or "ascii"
        sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding))
    sys.stdout.flush()


class _Output:
    """The ranks' output, read by one thread a rank and handed to ``sink`` a line at a time.

    Each line goes whole, with its ``[rank i]`` prefix once, under one lock: threads that
    wrote text and newline apart merged 167 of 80 000 lines of 4 ranks. A last line without
    a newline is a line too. ``lost`` keeps the peer each rank last reported losing (from a
    PeerError's message naming this rank); ``timed_out``, the ranks that reported a
    collective's timeout whose lost rank gloo does not name (:func:`unnamed_timeout`).
    """

    def __init__(self, sink: Callable[[str], None], ranks: int) -> None:
        self.sink = sink
        self.width = len(str(ranks - 1))
        self.lock = threading.Lock()
        self.lost: dict[int, int] = {}
        self.timed_out: set[int] = set()
        self.last: dict[int, str] = {}  # each rank's last line that is not blank
        self.threads: dict[int, threading.Thread] = {}
        self.drained: set[int] = set()
        self.handed: dict[int, int] = {}  # lines handed to ``sink``, per rank
        self.error: Exception | None = None  # the first that ``sink`` raised (not a closed pipe)

    def follow(self, rank: int, pipe: IO[str]) -> None:
        self.handed[rank] = 0
        t = threading.Thread(target=self._read, args=(rank, pipe), daemon=True)
        t.start()
        self.threads[rank] = t

    def _read(self, rank: int, pipe: IO[str]) -> None:
        prefix = f"[rank {rank:>{self.width}}] "
        with pipe:
            for line in pipe:
                text = line.removesuffix("\n")
                lost = peer_lost(text)
                if lost and lost[0] == rank:
                    self.lost[rank] = lost[1]
                elif unnamed_timeout(text) == rank:
                    self.timed_out.add(rank)
                if text.strip():
                    self.last[rank] = text
                with self.lock:
                    try:
                        self.sink(prefix + text)
                    except BrokenPipeError:  # gradwire's reader went away (`| head`): the
                        return  # rank's pipe closes too, as if it had written there itself
                    except Exception as e:  # a full disk, a sink of the caller's that fails:
                        if self.error is None:  # the run stops with it (_wait), not the
                            self.error = e  # thread with a traceback and the rank unseen
                        return
                    self.handed[rank] += 1

    def last_read(self) -> dict[int, str]:
        """Each rank's last line, for the ranks whose output has been read to its end: a
        reader held up by a slow ``sink`` (``| less``) may have more of it in the pipe, and
        its last line so far is not the rank's."""
        return {rank: line for rank, line in self.last.items()
                if rank in self.threads and not self.threads[rank].is_alive()}

    def drain(self, ranks: list[int]) -> None:
        """Wait (once per rank, 1 s for them all) for the rest of exited ranks' output: 1 s
        each, one after another, was a minute before the others were stopped where 60 ranks
        failed together and children they had started kept their pipes open."""
        end = time.monotonic() + DRAIN_S
        for rank in ranks:
            if rank not in self.drained:
                self.drained.add(rank)
                self.threads[rank].join(timeout=max(end - time.monotonic(), 0.0))

    def close(self) -> None:
        """Wait for the rest of every rank's output (the ranks are gone: their pipes end) while
        it keeps coming, for at most OUTPUT_MAX_S in all: a reader that hands on no line for
        2 s is given up (its sink blocks, or a process that left the rank's group holds the
        pipe). Ranks may write faster than ``sink`` takes their lines: what is still in the
        pipe when they exit is theirs too."""
        end = time.monotonic() + OUTPUT_MAX_S
        for rank, t in self.threads.items():
            seen = -1
            while t.is_alive() and self.handed[rank] != seen and time.monotonic() < end:
                seen = self.handed[rank]
                t.join(timeout=min(2.0, max(end - time.monotonic(), 0.0)))


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
    result names the first rank that failed and how, or the rank that stalled. A rank that
    exits naming a peer it lost first, or a collective's timeout whose lost rank gloo does
    not name, gives the others up to their own timeout (GRADWIRE_TIMEOUT) to fail in turn, so
    that the stalled rank can be named. ``linger``: seconds the others get first to fail on
    their own in any case (their errors then name the peer they lost); the fault tests use it
    to prove that no rank hangs. ``timeout`` bounds the whole run. A ``sink`` that raises
    (other than BrokenPipeError, which closes that rank's output as a closed stdout would)
    stops every rank, and the result says why.
    SIGINT, SIGTERM, SIGHUP or SIGQUIT stops every rank, then raises :class:`Interrupted`.
    """
    if isinstance(cmd, (str, bytes)):
        raise GradwireError(f"the command must be a list of arguments, not one string: "
                            f"got {cmd!r}; e.g. [sys.executable, 'train.py']")
    if not cmd:
        raise GradwireError("no command given: expected `gradwire run ... -- CMD ARGS...`")
    check_timeout(timeout)
    if not cluster.hosts:  # a state file with none: an IndexError traceback below
        raise GradwireError(f"cluster {cluster.name} has no hosts to run {cmd[0]!r} on")
    extra_env = extra_env or {}
    check_command(cmd, {**os.environ, **extra_env})
    try:
        settle = config.timeout({**os.environ, **extra_env})
    except GradwireError:
        settle = 0.0  # the ranks fail on it themselves, naming it
    first = cluster.hosts[0]
    # In a namespace rank 0 serves the store, where the cluster's hosts files name its
    # clients, on a port free there now (the system's pick, as torchrun's --standalone picks
    # one), so runs on one cluster at the same time do not share a port.
    store = (_loopback_store() if first.netns is None else contextlib.nullcontext(
        (call_in(first.netns, lambda: free_port(first.addr)), {})))
    with store as (port, store_env):
        return _start(cluster, cmd, timeout, sink or _print_line, {**store_env, **extra_env},
                      max(linger, 0.0), settle, port)


def _start(cluster: Cluster, cmd: Sequence[str], timeout: float | None,
           sink: Callable[[str], None], extra_env: Mapping[str, str], linger: float,
           settle: float, port: int) -> RunResult:
    procs: list[subprocess.Popen] = []
    output = _Output(sink, len(cluster.hosts))
    received: list[int] = []  # signals to the launcher, acted on between polls
    stopped, result = 0, None
    arm = _die_with_launcher()
    with on_signals(received.append):
        try:
            for host in cluster.hosts:
                if received:
                    break
                env = dict(os.environ)
                env.update(rank_env(cluster, host.rank, port))
                env.update(extra_env)
                argv = list(cmd)
                if host.netns is not None:
                    argv = ["ip", "netns", "exec", host.netns, *argv]
                try:
                    # Bytes that are not UTF-8 are replaced: a reader that failed on them
                    # would leave its rank blocked on a full pipe.
                    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, encoding="utf-8",
                                         errors="replace", start_new_session=True,
                                         preexec_fn=arm)
                except OSError as e:
                    raise GradwireError(f"cannot start {cmd[0]!r} for rank {host.rank}: "
                                        f"{e}") from e
                procs.append(p)
                output.follow(host.rank, p.stdout)  # type: ignore[arg-type]
            if not received:
                result = _wait(procs, output, timeout, linger, settle, received)
        finally:
            stopped = _stop(procs)
            output.close()
    if received:
        raise Interrupted(received[0], stopped)
    assert result is not None  # _wait returns None only on a signal
    return result


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_launcher() -> Callable[[], None] | None:
    """What a rank runs between fork and exec so that the kernel SIGKILLs it should the
    launcher die first (SIGKILL, the OOM killer, a CI job's hard stop), where no ``finally``
    stops the ranks: in sessions of their own, they ran on for good (and on an emulated
    cluster kept its namespaces busy). Linux only (prctl); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    except (OSError, AttributeError):
        return None
    launcher, option, sig = os.getpid(), ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(
        signal.SIGKILL.value)

    def arm() -> None:
        prctl(option, sig)
        if os.getppid() != launcher:  # the launcher died before the line above
            os._exit(128 + signal.SIGKILL.value)

    return arm


def _wait(procs: list[subprocess.Popen], output: _Output, timeout: float | None,
          linger: float, settle: float, received: list[int]) -> RunResult | None:
    """Poll the ranks until they all exit 0, one fails, or ``timeout``; None on a signal."""
    deadline = None if timeout is None else time.monotonic() + timeout
    # The first failure seen (a rank killed by a signal before ranks that exited with an error
    # at the same poll), when the others' linger ends, and when their time ends.
    first, linger_end, stop_at = None, 0.0, 0.0
    while not received:
        now = time.monotonic()
        codes = [_exit_status(p) for p in procs]
        exits = [RankExit(i, c) for i, c in enumerate(codes)]
        if output.error is not None:
            return RunResult(1, f"the ranks' output could not be handed on "
                             f"({type(output.error).__name__}: {output.error}); stopped the "
                             "ranks", exits)
        failed = [e for e in exits if e.returncode not in (None, 0)]
        output.drain([e.rank for e in failed])
        if failed and first is None:
            first = min(failed, key=lambda e: (e.returncode or 0) > 0)
            lost_one = _ended_on_error(first) and (first.rank in output.lost
                                                   or first.rank in output.timed_out)
            linger_end = now + linger
            stop_at = now + max(linger, settle if lost_one else 0.0)
        if first is not None:
            stalled = _stalled(exits, output.lost, output.timed_out)
            running = [e.rank for e in exits if e.returncode is None]
            timed_out = deadline is not None and now > deadline
            only_stalled = stalled and running == [stalled.rank] and now >= linger_end
            if not running or now >= stop_at or timed_out or only_stalled:
                return _failure(first, stalled, exits, output.last_read())
        elif all(c == 0 for c in codes):
            return RunResult(0, f"all {len(procs)} ranks exited 0", exits)
        elif deadline is not None and now > deadline:
            running = [e.rank for e in exits if e.returncode is None]
            return RunResult(124, f"timed out after {timeout:g} s; ranks still running: "
                             f"{', '.join(map(str, running))}", exits)
        time.sleep(0.05)
    return None


@dataclass(frozen=True)
class Stall:
    """The rank that stalled, the failed ranks that waited for it, and how they did."""

    rank: int
    losers: list[int]
    how: str  # what the failed ranks say of it: "lost it", "timed out ... waiting for it"


def _stalled(exits: list[RankExit], lost: dict[int, int], timed_out: set[int]) -> Stall | None:
    """The rank that stalled, or None where the failed ranks' errors do not show one.

    Named: each failed rank must have named the peer it lost (``lost``); following who lost
    whom through ranks that failed in turn (a ring's survivors wait on each other), every
    chain must end at the same rank, and that rank must still be running.

    Unnamed (a world of 3 or more, where gloo does not say which rank a collective lost):
    every rank but one exited with an error after a collective's timeout (``timed_out``, and
    no named peer), and that one still runs; a rank that aborted after its timeout
    (:func:`_ended_on_error`) counts as one that exited with it. A rank that exited 0, was
    killed otherwise, or failed in any other way (a crash, a closed connection: a rank that
    exited) leaves it unknown.
    """
    failed = [e.rank for e in exits if e.returncode not in (None, 0)]
    named = _named_stall(failed, exits, lost)
    if named is not None:
        return named
    waited = [e.rank for e in exits if _ended_on_error(e) and e.rank in timed_out
              and e.rank not in lost]
    running = [e.rank for e in exits if e.returncode is None]
    if waited and waited == failed and len(running) == len(exits) - len(failed) == 1:
        return Stall(running[0], failed, "timed out in a collective waiting for it")
    return None


def _ended_on_error(e: RankExit) -> bool:
    """Whether ``e`` ended as a rank ends on its own error: an exit status, or SIGABRT. A
    rank whose gloo all_reduce timed out in a world of 3 often aborts as it exits, after its
    one line ("terminate called without an active exception"); read as killed, it was named
    in place of the rank it waited for, in about 1 run of 3 where a rank stalled in the
    worker's epoch's sums among 3 ranks."""
    rc = e.returncode
    return rc is not None and (rc > 0 or rc == -signal.SIGABRT)


def _named_stall(failed: list[int], exits: list[RankExit], lost: dict[int, int]
                 ) -> Stall | None:
    """The rank every chain of lost peers from the ``failed`` ranks ends at, if it runs."""
    ends = set()
    for rank in failed:
        chain = [rank]
        while chain[-1] in failed:
            peer = lost.get(chain[-1])
            if peer is None or peer in chain or not 0 <= peer < len(exits):
                return None
            chain.append(peer)
        ends.add(chain[-1])
    if len(ends) != 1:
        return None
    (end,) = ends
    return Stall(end, failed, "lost it") if exits[end].returncode is None else None


_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # a terminal's control sequence (colours)
LAST_LINE_CHARS = 200  # of a failed rank's last line, in the run's one-line summary


def _failure(first: RankExit, stalled: Stall | None, exits: list[RankExit],
             last: Mapping[int, str] | None = None) -> RunResult:
    """The run's one-line summary. A rank that ended on its own error is given with its last
    line (a traceback's is the exception), which among many ranks' lines may have scrolled
    far above, as torchrun's summary gives the error its rank recorded."""
    rc = first.returncode if first.returncode and first.returncode > 0 else 1
    if stalled is None:
        said = (last or {}).get(first.rank) if _ended_on_error(first) else None
        if said is not None:
            # one line of plain text: whitespace made single spaces, other control
            # characters (a terminal's colour codes) dropped
            said = "".join(c for c in " ".join(_CSI.sub("", said).split())
                           if unicodedata.category(c)[0] != "C")
            if len(said) > LAST_LINE_CHARS:
                said = said[:LAST_LINE_CHARS - 3] + "..."
        ending = "" if not said else f" (its last line: {said})"
        return RunResult(rc, f"{first.describe()}{ending}; stopped the other ranks", exits)
    who = "rank" if len(stalled.losers) == 1 else "ranks"
    return RunResult(rc, f"rank {stalled.rank} stalled ({who} "
                     f"{', '.join(map(str, stalled.losers))} {stalled.how}); stopped the other "
                     "ranks", exits)


def _exit_status(p: subprocess.Popen) -> int | None:
    """``p``'s exit status as :attr:`Popen.returncode` gives it, None while it runs, read
    without reaping it: until :func:`_stop` has swept its process group, an exited rank stays a
    zombie that holds its pid, so the number, which is the group's, cannot pass to another
    process. (Reaped at once, as ``Popen.poll`` does, a rank that exited early left its number
    free, and the sweep at the end of the run killed whatever process group took it next.)"""
    if p.returncode is not None:
        return p.returncode
    try:
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return p.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _stop(procs: list[subprocess.Popen]) -> int:
    """SIGTERM every rank's process group, then SIGKILL what is left after a grace period;
    the ranks are reaped only then (:func:`_exit_status`).

    Returns how many ranks were still running.
    """
    live = [p for p in procs if _exit_status(p) is None]
    for p in live:
        _signal_group(p, signal.SIGTERM)
        _signal_group(p, signal.SIGCONT)  # a stopped (stalled) rank acts on it only then
    end = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < end and any(_exit_status(p) is None for p in live):
        time.sleep(0.05)
    for p in procs:
        # The group may outlive its leader (a rank's own children): always sweep it. Its
        # leader is not reaped yet, so the group is still the rank's.
        _signal_group(p, signal.SIGKILL)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            print(f"gradwire: pid {p.pid} did not exit after SIGKILL", file=sys.stderr)
    return len(live)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
