"""Joining the run: the env:// rendezvous of the rank processes gradwire starts (the training
worker, bench, calibrate, the emulated simulator), whose failure is one line that says what
happened and what to do, not c10d's log and a traceback.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping

import torch.distributed as dist

from gradwire.check import parse_int
from gradwire.errors import GradwireError


def join_world(backend: str, timeout: float, prog: str | None = None,
               join: float | None = None) -> None:
    """Join the run's process group as ``dist.init_process_group(backend, timeout=...)`` does,
    by torch's env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), ``timeout`` in
    seconds.

    A rendezvous that fails (rank 0 cannot listen on MASTER_PORT, a rank cannot reach its
    store, a rank that never comes) is one GradwireError line that says what happened and what
    to do (:func:`rendezvous_error`); c10d's own log of it, a few dozen lines, is not shown
    (:func:`_stderr_held`). One that succeeds is the same call, and shows what c10d wrote.

    A store that takes the connection and never answers (its process stopped, or MASTER_PORT
    another program's port) holds c10d's client without limit, in C++ that no signal gets
    out of. A watchdog then ends the process after :func:`stall_bound` seconds with one line,
    ``PROG: error: ...``: ``prog`` is the prefix the caller gives its other errors (default:
    the script's name, as argparse has it).

    ``join``: seconds the ranks get to join, where they differ from ``timeout`` (None: the
    same). Longer, so that a short limit meant to find a stalled rank quickly does not also
    fail ranks that start a few seconds apart (the train worker's ``--join-timeout``); shorter,
    so that a long collective limit (bench's largest sizes on slow links) does not also make a
    rank that never comes, or a store that never answers, a wait of half an hour (the
    watchdog's bound grows with it). The group's and its store's timeouts are set to
    ``timeout`` once joined, where this torch can (:func:`_timeout_setter`); where it cannot,
    the rendezvous waits ``timeout`` alone.
    """
    check_env(os.environ)
    if dist.is_initialized():  # torch's ValueError for it named none of this
        raise GradwireError("this process has joined a process group already: join the run "
                            "once, or dist.destroy_process_group() before joining again")
    setter = _timeout_setter() if join is not None and join != timeout else None
    wait = join if setter is not None and join is not None else timeout
    with _stderr_held() as real_stderr:
        watchdog = _Watchdog(stall_bound(wait), real_stderr,
                             f"{prog or os.path.basename(sys.argv[0]) or 'python'}: error: "
                             f"{_stalled(wait, os.environ)}")
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=wait))
        except ValueError as e:  # RANK, MASTER_ADDR, ... unset or not numbers
            raise GradwireError(f"cannot join the run's process group ({e}): start each rank "
                                "under gradwire run or torchrun, which set RANK, WORLD_SIZE, "
                                "MASTER_ADDR and MASTER_PORT") from None
        except (RuntimeError, TimeoutError) as e:  # c10d's DistNetworkError, DistStoreError
            raise rendezvous_error(str(e) or type(e).__name__, wait, os.environ) from None
        finally:
            watchdog.cancel()
    if setter is not None:
        limit = datetime.timedelta(seconds=timeout)
        setter(limit)
        # the store too: a store operation after joining (a second group's set-up) kept the
        # join's limit
        with contextlib.suppress(AttributeError, RuntimeError, ValueError):
            dist.distributed_c10d._get_default_store().set_timeout(limit)


def _timeout_setter() -> Callable[[datetime.timedelta], None] | None:
    """What sets the default process group's timeout after it is made, on this torch: the
    public ``set_timeout`` where it exists, else the private ``_set_pg_timeout`` (torch 2.2
    on); None where neither does."""
    for owner, name in ((dist, "set_timeout"), (dist.distributed_c10d, "_set_pg_timeout")):
        setter = getattr(owner, name, None)
        if callable(setter):
            return setter
    return None


def check_env(env: Mapping[str, str]) -> None:
    """Refuse in one line env:// variables that are set but cannot place this rank in a run
    (unset ones are c10d's to name). A RANK of 3 among 2 ranks, -1, or one in other scripts'
    digits (int() reads "١") had waited out the whole timeout for a store that no rank
    serves; "abc" had ended in int()'s message, which names no variable."""
    world = whole_env("WORLD_SIZE", 1, None, "the number of ranks", env)
    whole_env("RANK", 0, None if world is None else world - 1, "this rank's number", env)
    whole_env("MASTER_PORT", 0, 65535, "the port of the run's store", env)


def whole_env(name: str, low: int, high: int | None, what: str,
              env: Mapping[str, str] | None = None) -> int | None:
    """The environment variable ``name`` (of ``env``, default this process's) as a whole
    number from ``low`` to ``high`` (None: no upper end), None where it is unset; one
    GradwireError line saying ``what`` it is where it is anything else."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return None
    value = parse_int(raw)
    if value is None or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"from {low} to {high}"
        raise GradwireError(f"{name} must be a whole number {span} ({what}, as gradwire run "
                            f"and torchrun set it), got {raw!r}")
    return value


# Seconds the rank programs' ranks get to join by default (the worker's --join-timeout, bench's
# and calibrate's ranks): ranks started together arrive a few seconds apart (torch's import on a
# busy machine, CUDA's start), and a rank or store that never comes is found in minutes
# (:func:`stall_bound`), whatever the collectives' limit.
JOIN_S = 60.0
WATCHDOG_WRITE_S = 2.0  # the most the watchdog waits for its line to be written


def stall_bound(timeout: float) -> float:
    """Seconds after which a rendezvous with c10d ``timeout`` can only be held by a store that
    does not answer: c10d has given up or succeeded by then wherever its store answers.

    Its waits come one after another, each bounded by ``timeout`` but not the whole. Reaching
    the store: connect retries until ``timeout``, but its back-off sleeps (1.5 times an
    interval that grows by 1.5 from 0.5 s to 60 s) run past it, by up to about
    3.75 ``timeout`` + 2 s and at most 180 s (measured, nobody listening: 2.9 s at 1 s, 17 s
    at 10 s, 50 s at 20 s). Then rank 0's wait for the others to reach it (``timeout`` + 1 s:
    c10d counts whole seconds), gloo's exchange of addresses through the store, and its
    connections (``timeout`` each). 2 s more for a busy machine.
    """
    return 3 * timeout + min(4 * timeout + 2, 180) + 2


def _stalled(timeout: float, env: Mapping[str, str]) -> str:
    """The error of an env:// rendezvous under ``env`` held past :func:`stall_bound` by a
    store that took the connection but did not answer."""
    rank, addr, port = (env.get(k, "?") for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"))
    return (f"rank {rank} could not join the run's process group at {addr}:{port} within "
            f"{timeout:g} s: its store there took the connection but gave no answer in "
            f"{stall_bound(timeout):.0f} s ({_owner(env)} is stopped or stuck, or MASTER_PORT is "
            "another program's port: give another)")


class _Watchdog:
    """Ends this process with ``line`` on descriptor ``fd`` unless cancelled within
    ``seconds``.

    The main thread is then inside c10d's C++ (a ``recv`` on the store's socket) with the GIL
    released: this thread runs, but nothing it can do gets that call to return
    (``_thread.interrupt_main`` and a SIGINT to the process or to the main thread only mark
    an exception for when it does; c10d resumes the ``recv``). So it writes the line and
    exits.
    """

    def __init__(self, seconds: float, fd: int, line: str) -> None:
        self._fd, self._line = fd, line
        self._lock = threading.Lock()  # a join that returns as it fires is not ended
        self._done = False
        self._timer = threading.Timer(min(seconds, threading.TIMEOUT_MAX), self._fire)
        self._timer.daemon = True
        self._timer.name = "gradwire rendezvous watchdog"
        self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
        self._timer.join()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            # The line and what the program printed before it joined (c10d's own lines, held,
            # are dropped as for any failed rendezvous), written aside: a write to a full pipe
            # that nobody reads blocks, and the process must end all the same.
            writer = threading.Thread(target=self._say, daemon=True,
                                      name="gradwire rendezvous watchdog's line")
            writer.start()
            writer.join(WATCHDOG_WRITE_S)
            os._exit(1)

    def _say(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._fd, f"{self._line}\n".encode(errors="replace"))
        for stream in (sys.stdout, sys.__stdout__):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()


def rendezvous_error(message: str, timeout: float, env: Mapping[str, str]) -> GradwireError:
    """The error of an env:// rendezvous under ``env`` that failed with c10d's ``message``
    (its first line says what happened; the rest is a C++ backtrace) after at most
    ``timeout`` seconds."""
    rank, addr, port = (env.get(k, "?") for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"))
    listen = re.search(r"failed to listen.*?name: (\w+), message: ([\w ]+)", message)
    if listen:  # rank 0's store: "... port: P, useIpv6: false, code: -98, name: EADDRINUSE, ..."
        why = ("the port is in use (another run holds it; give another MASTER_PORT)"
               if listen[1] == "EADDRINUSE" else f"{listen[2]} ({listen[1]}): give another "
               "MASTER_PORT")
        return GradwireError(f"rank {rank} could not listen on port {port}: {why}")
    owner = _owner(env)
    head = f"rank {rank} could not join the run's process group at {addr}:{port}"
    low = message.lower()
    joined = re.search(r"(\d+)/(\d+) clients joined", message)
    if joined:  # rank 0, whose store waits for every rank to connect
        return GradwireError(f"{head} within {timeout:g} s: only {joined[1]} of {joined[2]} "
                             f"ranks reached its store (the others exited, stalled, or cannot "
                             f"reach {addr})")
    if "client socket has" in low:  # "... timed out after Nms while trying to connect to"
        return GradwireError(f"{head} within {timeout:g} s: {_unreached(addr, rank, owner)}")
    if "wait timeout" in low:  # the store answered; a rank's gloo address never came
        return GradwireError(f"{head} within {timeout:g} s: a rank reached the store but not "
                             "the group (it exited or stalled)")
    if "closed" in low or "reset by peer" in low or "broken pipe" in low:
        return GradwireError(f"{head}: the connection to {owner}'s store closed ({owner} "
                             "exited or was killed)")
    if "timed out" in low or "timeout" in low:
        return GradwireError(f"{head} within {timeout:g} s: a rank exited or stalled before "
                             "joining")
    first = message.splitlines()[0][-200:] if message else "unknown error"
    return GradwireError(f"{head}: {first}")


def _owner(env: Mapping[str, str]) -> str:
    """Who serves the store: the launcher, on loopback (TORCHELASTIC_USE_AGENT_STORE), as
    torchrun's agent does; else rank 0."""
    return ("the launcher" if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            else "rank 0")


def _unreached(addr: str, rank: str, owner: str) -> str:
    """Why a rank did not reach the store at MASTER_ADDR ``addr`` in time, as far as this
    machine can tell: a name it cannot resolve, else the store's host not there."""
    try:
        found = {info[4][0] for info in socket.getaddrinfo(addr, None)}
    except (OSError, UnicodeError):  # socket.gaierror; a name too long to encode
        return f"MASTER_ADDR {addr!r} is no host name this machine resolves"
    if rank == "0" and owner == "rank 0":  # its own store is up: the address is wrong
        return f"{addr} is not this host's address, or cannot be reached"
    loopback = all(ipaddress.ip_address(a.partition("%")[0]).is_loopback for a in found)
    also = "" if loopback else f", or {addr} is not its address or cannot be reached"
    return f"{owner} did not start its store (it exited or stalled){also}"


@contextlib.contextmanager
def _stderr_held() -> Iterator[int]:
    """What this process writes to its standard error (file descriptor 2) in the block, held
    back: written out after a block that returns, dropped after one that raises. The block
    gets a descriptor of the real standard error, to write past the hold.

    c10d's C++ code logs to descriptor 2 itself, past ``sys.stderr`` (``[W... socket.cpp:764]
    [c10d] The IPv6 network addresses of ... cannot be retrieved``, ``[c10d] The client socket
    has timed out ...``, each retry with a C++ backtrace). Its level, TORCH_CPP_LOG_LEVEL, is
    read once, when torch loads: set for the process it would hide every later warning of
    the run as well. Holding the descriptor for the rendezvous alone drops exactly its lines
    where it fails (the one-line error says what they said) and shows them unchanged once
    it has succeeded. Python's ``logging`` (torch.distributed's loggers) writes through
    ``sys.stderr``, flushed into the held file before it is let go. Other threads' writes in
    the block are held too: the rank programs join before they start any.
    """
    def flush() -> None:
        for stream in {sys.stderr, sys.__stderr__} - {None}:
            with contextlib.suppress(OSError, ValueError):  # closed, or no file behind it
                stream.flush()

    try:
        held = tempfile.TemporaryFile()
    except OSError:  # nowhere to hold it: shown as c10d writes it
        yield 2
        return
    with held:
        flush()
        try:
            saved = os.dup(2)
        except OSError:  # no descriptor 2 to hold (a process started without one)
            yield 2
            return
        os.dup2(held.fileno(), 2)
        try:
            yield saved
        finally:
            flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        shown = held.read()
    if shown:
        # A standard error that is closed, or a pipe whose reader has gone, failed c10d's own
        # writes without a word: the lines are lost the same way, and the joined rank goes on.
        with contextlib.suppress(OSError), open(2, "wb", closefd=False) as out:
            out.write(shown)
