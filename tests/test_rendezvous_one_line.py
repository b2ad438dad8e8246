"""A rendezvous that fails is one line in every rank program gradwire starts: real processes
joining over loopback by env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each failing in
the rendezvous itself, print one error line saying what happened, with no traceback and none
of c10d's own log lines."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch.distributed as dist
from conftest import run_cli
from hypothesis import given
from hypothesis import strategies as st

import gradwire.launcher
from gradwire.errors import GradwireError
from gradwire.launcher import free_port
from gradwire.rendezvous import _stderr_held, join_world, rendezvous_error

OUT = "<out>"  # where a program writes its result: a file of the test's
# The rank programs, each with arguments that pass their own checks: all join first thing.
PROGRAMS = {
    "worker": ["gradwire.train.worker", "--epochs", "1"],
    "bench": ["gradwire.bench.rank", "--collective", "allreduce", "--sizes", "1024", "--algos",
              '[{"label": "ring", "name": "ring", "params": {}}]', "--out", OUT],
    "calibrate": ["gradwire.bench.calibrate", "--device", "cpu", "--out", OUT],
    "emulate": ["gradwire.sim.emulate", "--stream-alpha", "--out", OUT],
}
NOISE = ("Traceback", "[c10d]", "socket.cpp", "TCPStore", "frame #")


def _start(argv: list[str], rank: int, port: int, addr: str = "127.0.0.1") -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": addr,
           "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    return subprocess.Popen([sys.executable, "-m", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _one_line(p: subprocess.Popen, *needles: str) -> str:
    """``p`` exits non-zero having printed one line, holding each of ``needles``."""
    out, err = p.communicate(timeout=60)
    text = out + err
    assert p.returncode != 0 and len(text.strip().splitlines()) == 1, text
    assert not any(n in text for n in NOISE), text
    for needle in needles:
        assert needle in text, text
    return text


def test_a_taken_port_is_one_line_in_every_rank_program(held_port, tmp_path):
    """Rank 0 cannot listen on MASTER_PORT: it says so and what to do, in each program."""
    procs = {name: _start([str(tmp_path / name) if a == OUT else a for a in argv], 0,
                          held_port) for name, argv in PROGRAMS.items()}
    for name, p in procs.items():
        text = _one_line(p, f"rank 0 could not listen on port {held_port}: the port is in use",
                         "give another MASTER_PORT")
        assert "error: " in text, (name, text)


def test_ranks_whose_peers_never_come_say_so_in_one_line():
    """Rank 1 with no rank 0 (and with a MASTER_ADDR that names no host), rank 0 with no
    rank 1: each gives up after the worker's --join-timeout, naming what it waited for."""
    worker = [*PROGRAMS["worker"], "--timeout", "1", "--join-timeout", "1"]
    alone, nobody = free_port(), free_port()
    procs = [_start(worker, 1, nobody), _start(worker, 0, alone),
             _start(worker, 1, nobody, addr="no-such-host.invalid")]
    _one_line(procs[0], f"rank 1 could not join the run's process group at 127.0.0.1:{nobody} "
              "within 1 s: rank 0 did not start its store")
    _one_line(procs[1], f"rank 0 could not join the run's process group at 127.0.0.1:{alone}",
              "only 1 of 2 ranks reached its store")
    _one_line(procs[2], "rank 1 could not join", "MASTER_ADDR 'no-such-host.invalid' is no "
              "host name this machine resolves")


def test_gradwire_train_shows_the_failing_rank_in_one_line(monkeypatch, capsys, held_port):
    """``gradwire train --loopback``: the rank whose rendezvous failed shows one line saying
    why, and the last line names that rank."""
    @contextlib.contextmanager
    def taken_store():  # rank 0 serves the store itself, on a port another socket holds
        yield held_port, {}

    monkeypatch.setattr(gradwire.launcher, "_loopback_store", taken_store)
    code, out, err = run_cli(monkeypatch, capsys, ["train", "--loopback", "--hosts", "2",
                                                   "--epochs", "1"])
    flat = " ".join(out.split())  # Rich wraps a long line at the console's width
    assert code != 0 and flat.count("[rank") == 1, out + err
    assert flat.startswith("[rank 0] gradwire train: error: rank 0 could not listen on "
                           f"port {held_port}: the port is in use"), out
    assert not any(n in out + err for n in NOISE), out + err
    summary = err.strip().splitlines()[-1]  # with the rank's own line, from its output
    assert (f"rank 0 exited with status 1 (its last line: gradwire train: error: rank 0 could "
            f"not listen on port {held_port}: the port is in use" in summary
            and summary.endswith("; stopped the other ranks")), err


def test_a_rendezvous_that_succeeds_is_the_same_call(monkeypatch, capfd):
    """Joined by env://: gloo, every rank, and standard error as it was, before and after."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    join_world("gloo", 10)
    try:
        assert (dist.get_backend(), dist.get_world_size(), dist.get_rank()) == ("gloo", 1, 0)
        os.write(2, b"a later warning\n")
        # joining twice says so, not that the rank lacks torchrun's variables
        with pytest.raises(GradwireError, match="^this process has joined a process group "
                           "already: join the run once"):
            join_world("gloo", 10)
        assert dist.get_world_size() == 1  # the group it has stays
    finally:
        dist.destroy_process_group()
    assert capfd.readouterr().err == "a later warning\n"


def test_what_the_rendezvous_writes_is_shown_unless_it_fails(capfd):
    with _stderr_held():
        os.write(2, b"c10d's line\n")
    assert capfd.readouterr().err == "c10d's line\n"
    with pytest.raises(RuntimeError), _stderr_held():
        os.write(2, b"c10d's line\n")
        raise RuntimeError("the rendezvous failed")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


@given(st.text())
def test_every_rendezvous_error_is_one_line(message):
    env = {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    text = str(rendezvous_error(message, 30, env))
    assert len(text.splitlines()) == 1 and text.startswith("rank 1 could not "), text
