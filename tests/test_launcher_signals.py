"""SIGINT, SIGTERM, SIGHUP or SIGQUIT to `gradwire run`: every rank is stopped (they run in
sessions of their own, out of reach of the terminal's signals), the emulated cluster is
removed, one line on stderr says so, and the exit status is 128 + the signal's number."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import alive, gradwire_leftovers, needs_netns

from gradwire.cluster import cluster_down
from gradwire.errors import GradwireError

RANK = ("import os, time; print('PID', os.getpid(), os.environ['NCCL_HOSTID'], flush=True); "
        "time.sleep(60)")
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]


def _default_signals() -> None:
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored,
    # and an ignored signal stays ignored (as nohup's SIGHUP must): give the run the
    # dispositions a terminal would.
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _signal_a_run(sig: signal.Signals, *mode: str) -> None:
    p = subprocess.Popen([sys.executable, "-m", "gradwire", "run", "--hosts", "2", *mode, "--",
                          sys.executable, "-c", RANK], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    pids: list[int] = []
    clusters = set()
    try:
        while len(pids) < 2:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            m = re.match(r"\[rank \d\] PID (\d+) gradwire-(\S+)-host\d", line)
            assert m, line
            pids.append(int(m[1]))
            clusters.add(m[2])
        p.send_signal(sig)
        _, err = p.communicate(timeout=20)
        assert p.returncode == 128 + sig, err
        assert err == (f"gradwire run: interrupted by {sig.name}; stopped 2 ranks and cleaned "
                       "up\n")
        assert not [pid for pid in pids if alive(pid)]  # the launcher reaped them first
        for name in clusters - {"loopback"}:
            assert gradwire_leftovers(name) == []
    finally:  # what a failed check leaves is not the next test's problem
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for name in clusters - {"loopback"}:
            with contextlib.suppress(GradwireError):
                cluster_down(name)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_to_run_on_loopback_stops_every_rank(sig):
    _signal_a_run(sig, "--loopback")


@needs_netns
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_to_run_on_the_emulated_cluster_stops_every_rank_and_removes_it(sig):
    _signal_a_run(sig)


def test_a_signal_outside_a_launch_is_one_line_and_its_exit_status(monkeypatch, capsys):
    """Any command (here a stand-in for the app): SIGTERM unwinds it, `finally` blocks run,
    and main prints one line and exits 143; the handlers it set are restored afterwards."""
    from gradwire import cli

    unwound = []

    def app(standalone_mode: bool) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            unwound.append(True)

    def ours(signum, frame):  # should main not take SIGTERM over, this one (not death) gets it
        pass

    monkeypatch.setattr(cli, "app", app)
    before = signal.signal(signal.SIGTERM, ours)
    try:
        with pytest.raises(SystemExit) as e:
            cli.main()
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)
    assert e.value.code == 143 and unwound == [True]
    assert capsys.readouterr().err == "gradwire: interrupted by SIGTERM; cleaned up\n"
