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
from collections.abc import Iterator, Mapping

import torch.distributed as dist

from gradwire.errors import GradwireError


def join_world(backend: str, timeout: float) -> None:
    """Join the run's process group as ``dist.init_process_group(backend, timeout=...)`` does,
    by torch's env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), ``timeout`` in
    seconds.

    A rendezvous that fails (rank 0 cannot listen on MASTER_PORT, a rank cannot reach its
    store, a rank that never comes) is one GradwireError line that says what happened and what
    to do (:func:`rendezvous_error`); c10d's own log of it, a few dozen lines, is not shown
    (:func:`_stderr_held`). One that succeeds is the same call, and shows what c10d wrote.
    """
    with _stderr_held():
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        except ValueError as e:  # RANK, MASTER_ADDR, ... unset or not numbers
            raise GradwireError(f"cannot join the run's process group ({e}): start each rank "
                                "under gradwire run or torchrun, which set RANK, WORLD_SIZE, "
                                "MASTER_ADDR and MASTER_PORT") from None
        except (RuntimeError, TimeoutError) as e:  # c10d's DistNetworkError, DistStoreError
            raise rendezvous_error(str(e) or type(e).__name__, timeout, os.environ) from None


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
    # The launcher serves the store itself on loopback (TORCHELASTIC_USE_AGENT_STORE), as
    # torchrun's agent does; else rank 0 serves it.
    owner = ("the launcher" if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
             else "rank 0")
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
def _stderr_held() -> Iterator[None]:
    """What this process writes to its standard error (file descriptor 2) in the block, held
    back: written out after a block that returns, dropped after one that raises.

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
        yield
        return
    with held:
        flush()
        try:
            saved = os.dup(2)
        except OSError:  # no descriptor 2 to hold (a process started without one)
            yield
            return
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        shown = held.read()
    if shown:
        with open(2, "wb", closefd=False) as out:
            out.write(shown)
