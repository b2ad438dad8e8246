"""A rendezvous whose store takes the connection but never answers (rank 0 stopped, or
MASTER_PORT another program's port) held a rank for ever inside c10d: it now ends, in every
rank program, after ``stall_bound(timeout)`` seconds with one line that carries the program's
own error prefix. A rendezvous that ends by itself leaves no watchdog behind."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist
from test_rendezvous_one_line import NOISE, OUT, PROGRAMS

from gradwire.errors import GradwireError
from gradwire.launcher import free_port
from gradwire.rendezvous import join_world, stall_bound

TIMEOUT = 0.1  # the rendezvous timeout of every rank here: the bound is then 4.7 s
WATCHDOG = "gradwire rendezvous watchdog"
# Runs the rank program named by its first argument as ``python -m`` would, with TIMEOUT as
# its rendezvous timeout: bench and calibrate fix theirs at 60 s, emulate at 120 s.
RUNNER = f"""
import runpy, sys
import gradwire.rendezvous as r
join_ = r.join_world
r.join_world = lambda backend, timeout, join=None, **kw: join_(backend, {TIMEOUT}, **kw)
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def _rank(name: str, rank: int, port: int, tmp_path) -> subprocess.Popen:
    argv = [str(tmp_path / f"{name}{rank}") if a == OUT else a for a in PROGRAMS[name]]
    if name == "worker":
        argv += ["--timeout", str(TIMEOUT), "--join-timeout", str(TIMEOUT)]
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    return subprocess.Popen([sys.executable, "-c", RUNNER, *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line(p: subprocess.Popen, limit: float) -> str:
    """The one line ``p`` printed, exiting non-zero within ``limit`` seconds."""
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"still joining after {limit:.0f} s")
    text = out + err
    assert p.returncode != 0 and len(text.strip().splitlines()) == 1, text
    assert not any(n in text for n in NOISE), text
    return text.strip()


def test_a_store_that_never_answers_is_one_line_in_every_rank_program(held_port, tmp_path):
    """Rank 1 of each program ends after the bound, in one line that says what happened and
    starts as that program's other errors do (learned from rank 0 failing to listen on the
    same port, which c10d itself reports)."""
    bound = stall_bound(TIMEOUT)
    start = time.monotonic()
    stalled = {name: _rank(name, 1, held_port, tmp_path) for name in PROGRAMS}
    taken = {name: _rank(name, 0, held_port, tmp_path) for name in PROGRAMS}
    try:
        for name in PROGRAMS:
            own = _line(taken[name], 120)
            prefix = own[:own.index("error: ") + len("error: ")]
            text = _line(stalled[name], bound + 120)
            assert time.monotonic() - start >= bound, text  # the watchdog's doing, not c10d's
            assert text.startswith(
                f"{prefix}rank 1 could not join the run's process group at "
                f"127.0.0.1:{held_port} within {TIMEOUT:g} s: its store there took the "
                f"connection but gave no answer in {bound:.0f} s (rank 0 is stopped or stuck, "
                "or MASTER_PORT is another program's port: give another)"), (name, text)
    finally:
        for p in [*stalled.values(), *taken.values()]:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_the_watchdog_is_gone_once_the_rendezvous_ends(monkeypatch):
    """Cancelled when c10d fails in time (rank 1, nobody listening) and when it succeeds."""
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    with pytest.raises(GradwireError, match="rank 0 did not start its store"):
        join_world("gloo", TIMEOUT)
    assert not any(t.name == WATCHDOG for t in threading.enumerate())
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    join_world("gloo", 10)
    try:
        assert not any(t.name == WATCHDOG for t in threading.enumerate())
    finally:
        dist.destroy_process_group()


def test_a_rank_that_joined_outlives_the_bound():
    """A world of one joins, then waits past the bound: the process goes on, nothing said."""
    code = ("import sys, time\n"
            "import torch.distributed as dist\n"
            "from gradwire.rendezvous import join_world, stall_bound\n"
            f"join_world('gloo', {TIMEOUT}, prog='probe')\n"
            f"time.sleep(stall_bound({TIMEOUT}) + 1)\n"
            "print('alive', flush=True)\n"
            "dist.destroy_process_group()\n")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=stall_bound(TIMEOUT) + 120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "alive\n", ""), r.stderr


FULL_PIPE = """
import os, time
from gradwire.rendezvous import _Watchdog
r, w = os.pipe()
os.set_blocking(w, False)
try:
    while True:
        os.write(w, b"x" * 65536)
except BlockingIOError:
    pass
os.set_blocking(w, True)  # full, and nobody reads it
_Watchdog(0.1, w, "the watchdog's line")
time.sleep(60)
"""


def test_a_watchdog_whose_line_cannot_be_written_still_ends_the_process():
    """Its write blocks on a full pipe that nobody reads; the process ends all the same."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", FULL_PIPE], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - t0 < 20
