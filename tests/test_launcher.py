import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import alive, cli_error, gradwire_leftovers, needs_netns, pids_in, script

from gradwire.cluster import ephemeral_cluster, loopback_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import (
    LAST_LINE_CHARS,
    MALLOC_TUNABLES,
    PEER_LOST,
    RankExit,
    _failure,
    _Output,
    launch,
)


def _collect(cluster, cmd, **kw):
    lines: list[str] = []
    res = launch(cluster, cmd, sink=lines.append, **kw)
    return res, lines


def _envs(lines):
    out = {}
    for line in lines:
        prefix, _, rest = line.partition("] ")
        if rest.startswith("ENV "):
            out[int(prefix.split()[-1])] = json.loads(rest[4:])
    return out


def test_torchrun_environment_on_loopback():
    res, lines = _collect(loopback_cluster(3), script("echo_env.py"), timeout=60)
    assert res.returncode == 0, lines
    envs = _envs(lines)
    assert sorted(envs) == [0, 1, 2]
    for r, e in envs.items():
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == "3"
        assert e["LOCAL_RANK"] == "0" and e["LOCAL_WORLD_SIZE"] == "1"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["GLOO_SOCKET_IFNAME"] == "lo"
        # torchrun's other names for them, one worker a node; the launcher serves the store
        assert _torchrun_names(e, r, 3) and e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1


def _torchrun_names(e: dict, rank: int, world: int) -> bool:
    """Whether ``e`` has what torchrun gives every worker besides RANK and WORLD_SIZE, with
    one worker a node, one role, no restarts and the default run id."""
    return {k: e[k] for k in ("GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                              "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
                              "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID")} == {
        "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": str(world), "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}


@pytest.mark.parametrize("name,default,given", [
    ("GLIBC_TUNABLES", MALLOC_TUNABLES, None), ("GLIBC_TUNABLES", MALLOC_TUNABLES, ""),
    ("GLIBC_TUNABLES", MALLOC_TUNABLES, "glibc.malloc.arena_max=2"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", None),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "3")])
def test_ranks_get_a_default_setting_unless_the_caller_chose_one(monkeypatch, name, default,
                                                                 given):
    """GLIBC_TUNABLES: gradwire's (huge pages, no unmapping of freed buffers) by default;
    TORCH_NCCL_ASYNC_ERROR_HANDLING: torchrun's 1 (a failed NCCL call ends the rank instead of
    leaving it hung). Whatever the caller set, an empty value included, otherwise."""
    if given is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, given)
    res, lines = _collect(loopback_cluster(2), script("echo_env.py"), timeout=60)
    assert res.returncode == 0, lines
    want = default if given is None else given
    assert [e[name] for e in _envs(lines).values()] == [want, want]


@pytest.mark.parametrize("code,expect", [("3", "rank 1 exited with status 3"),
                                         ("KILL", "rank 1 was killed by SIGKILL")])
def test_a_failing_rank_stops_the_others_and_is_named(code, expect):
    t0 = time.monotonic()
    # rank 1 fails 2 s in: at 0.2 s a loaded machine had not yet started rank 0 or 2 far
    # enough to print its PID, and the count of stopped ranks below came out 2
    res, lines = _collect(loopback_cluster(3), script("fail_rank.py"), timeout=60,
                          extra_env={"FAIL_RANK": "1", "FAIL_CODE": code, "FAIL_AFTER": "2"})
    assert res.returncode != 0
    assert res.message.startswith(expect)
    assert time.monotonic() - t0 < 30  # the sleeping ranks were stopped, not waited for
    assert [e.returncode for e in res.exits if e.rank != 1] == [None, None]
    pids = pids_in(lines)
    # the rank that exited on its error is given with its last line; a killed one is not
    said = [line.split("] ", 1)[1] for line in lines if line.startswith("[rank 1]")][-1]
    assert res.message == (f"{expect} (its last line: {said}); stopped the other ranks"
                           if code == "3" else f"{expect}; stopped the other ranks")
    assert len(pids) == 3 and not [pid for pid in pids if alive(pid)]  # stopped and reaped


def test_the_summary_gives_a_failed_ranks_last_line_on_one_short_line():
    """What the rank printed last that is not blank, its whitespace made single spaces and
    cut to LAST_LINE_CHARS; a rank that ended on its own error (an exit status, SIGABRT)
    has it, a rank killed otherwise has none."""
    output = _Output(lambda line: None, 3)
    output.follow(0, io.StringIO("ValueError: bad\tshape (3, 4)\n   \n\n"))
    output.follow(1, io.StringIO("x" * 500 + "\n"))
    output.follow(2, io.StringIO("epoch 3\n"))
    output.close()
    exits = [RankExit(0, 1), RankExit(1, -signal.SIGABRT), RankExit(2, -signal.SIGKILL)]
    assert _failure(exits[0], None, exits, output.last).message == (
        "rank 0 exited with status 1 (its last line: ValueError: bad shape (3, 4)); stopped "
        "the other ranks")
    aborted = _failure(exits[1], None, exits, output.last).message
    assert aborted == (f"rank 1 was killed by SIGABRT (its last line: "
                       f"{'x' * (LAST_LINE_CHARS - 3)}...); stopped the other ranks")
    assert _failure(exits[2], None, exits, output.last).message == (
        "rank 2 was killed by SIGKILL; stopped the other ranks")
    assert _failure(RankExit(0, 1), None, exits, {}).message == (
        "rank 0 exited with status 1; stopped the other ranks")


def test_a_summary_gives_no_last_line_of_output_not_read_to_its_end():
    """A reader held up by a slow sink (`gradwire run | less`) has more of the rank's output
    to read: its last line so far would point at the wrong thing, so none is given."""
    let_go = threading.Event()
    output = _Output(lambda line: let_go.wait(30), 1)
    output.follow(0, io.StringIO("line 1\n\x1b[31mValueError: the real error\x1b[0m\n"))
    time.sleep(0.2)  # the reader is held in the sink at its first line
    assert output.last == {0: "line 1"} and output.last_read() == {}
    let_go.set()
    output.close()
    assert output.last_read() == {0: "\x1b[31mValueError: the real error\x1b[0m"}
    exits = [RankExit(0, 1)]
    assert _failure(exits[0], None, exits, output.last_read()).message == (
        "rank 0 exited with status 1 (its last line: ValueError: the real error); stopped "
        "the other ranks")


def test_timeout_stops_everything():
    res, lines = _collect(loopback_cluster(2), ["sh", "-c", "echo PID $$; exec sleep 30"],
                          timeout=2)
    assert res.returncode == 124 and "timed out after 2 s" in res.message
    pids = pids_in(lines)
    assert len(pids) == 2 and not [pid for pid in pids if alive(pid)]  # stopped and reaped


@pytest.mark.parametrize("cmd,timeout,msg", [([], None, "no command given"),
                                             ("train.py", None, "not one string"),
                                             (["true"], 0, "--timeout must be a number of seconds"),
                                             (["/no/such/binary"], None, "cannot start")])
def test_bad_launch_input(cmd, timeout, msg):
    with pytest.raises(GradwireError, match=msg):
        launch(loopback_cluster(1), cmd, timeout=timeout)


@needs_netns
def test_sigkilled_rank_on_the_emulated_cluster_leaves_nothing_behind():
    with ephemeral_cluster(3, "1gbit") as c:
        res, _ = _collect(c, script("fail_rank.py"), timeout=30,
                          extra_env={"FAIL_RANK": "2", "FAIL_CODE": "KILL"})
        name = c.name
    assert res.returncode != 0 and res.message.startswith("rank 2 was killed by SIGKILL")
    assert gradwire_leftovers(name) == []


@needs_netns
def test_environment_inside_namespaces(monkeypatch):
    # gradwire started from a torchrun worker: its store flag must not reach the ranks, which
    # would all be clients of a store nobody serves (rank 0 serves it here)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with ephemeral_cluster(2, "1gbit") as c:
        res, lines = _collect(c, script("echo_env.py"), timeout=60)
        envs = _envs(lines)
        assert res.returncode == 0
        assert envs[1]["MASTER_ADDR"] == c.hosts[0].addr
        assert envs[1]["GLOO_SOCKET_IFNAME"] == "eth0"
        for r, e in envs.items():
            assert _torchrun_names(e, r, 2) and e["TORCHELASTIC_USE_AGENT_STORE"] == "False"


@needs_netns
def test_two_runs_on_one_cluster_at_once():
    """Each run's rendezvous gets a port of its own in rank 0's namespace, so two jobs can
    share a cluster (`gradwire run --cluster`), each with its own ranks."""
    with ephemeral_cluster(2, "1gbit") as c:
        runs = [subprocess.Popen([sys.executable, "-m", "gradwire", "run", "--cluster", c.name,
                                  "--timeout", "120", "--", *script("p2p_exchange.py")],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, "SEED": str(i), "MODE": "batch"})
                for i in range(2)]
        outs = [p.communicate(timeout=180)[0] for p in runs]
    for p, out in zip(runs, outs, strict=True):
        assert p.returncode == 0, out[-2000:]
        assert out.count("COUNTERS ") == 2


LINES = ("import os, sys\n"
         "r, n = os.environ['RANK'], int(sys.argv[1])\n"
         "for i in range(n - 1):\n"
         "    sys.stdout.write(f'line {i} from rank {r}\\n')\n"
         "sys.stdout.write(f'line {n - 1} from rank {r}')  # the last without a newline\n")


def _run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradwire", "run", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_every_line_of_every_rank_is_whole_and_prefixed_once():
    """4 ranks × 5000 lines written at once through `gradwire run`'s own output: no line of
    one rank runs into another's, none is lost, the partial last line included."""
    n = 5000
    p = _run_cli("--loopback", "--hosts", "4", "--", sys.executable, "-c", LINES, str(n))
    assert p.returncode == 0, p.stderr
    seen: dict[int, list[int]] = {r: [] for r in range(4)}
    for line in p.stdout.splitlines():
        m = re.fullmatch(r"\[rank (\d)\] line (\d+) from rank (\d)", line)
        assert m and m[1] == m[3], line
        seen[int(m[1])].append(int(m[2]))
    assert all(got == list(range(n)) for got in seen.values())


def test_long_lines_stay_whole():
    """Lines far longer than a pipe's buffer (64 KiB), from 4 ranks at once."""
    rank = ("import os, sys\nr = os.environ['RANK']\n"
            "for _ in range(5):\n    sys.stdout.write(r * 300_000 + '\\n')\n")
    p = _run_cli("--loopback", "--hosts", "4", "--", sys.executable, "-c", rank)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert sorted(lines) == sorted(f"[rank {r}] " + str(r) * 300_000 for r in range(4)
                                   for _ in range(5))


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e400"])
def test_run_refuses_a_timeout_that_is_not_a_positive_number(monkeypatch, capsys, value):
    code, err = cli_error(monkeypatch, capsys, "run", "--loopback", "--timeout", value, "--",
                          "true")
    shown = {"1e400": "inf", "0": "0.0", "-1": "-1.0"}.get(value, value)
    assert code == 2 and err == (f"gradwire: error: --timeout must be a number of seconds "
                                 f"from 0.001 to 2e+06, got {shown}\n")


def test_the_state_folder_expands_a_home_folder(monkeypatch):
    """GRADWIRE_STATE_DIR=~/gw was taken as a folder named "~" in the current one, as
    GRADWIRE_HOME was not."""
    from gradwire import config

    monkeypatch.setenv("GRADWIRE_STATE_DIR", "~/gw-state")
    assert config.state_dir() == Path("~/gw-state").expanduser()
    assert "~" not in str(config.state_dir())


@pytest.mark.parametrize("blank", ["", "  ", "\t"])
def test_a_blank_environment_variable_means_the_default(monkeypatch, blank):
    from gradwire import config

    for name in ("GRADWIRE_HOME", "GRADWIRE_STATE_DIR", "GRADWIRE_TIMEOUT",
                 "GRADWIRE_CHECK_CALLS"):
        monkeypatch.setenv(name, blank)
    assert config.home() == Path("~/.cache/gradwire").expanduser()
    assert config.state_dir() == Path("/run/gradwire")
    assert config.timeout() == 60.0
    assert config.check_calls() is True


@pytest.mark.parametrize("op,why", [("recv", "Timed out waiting 4000ms"),
                                    ("send", "Connection closed by peer")])
def test_the_peer_a_rank_lost_is_read_from_its_error(op, why):
    """PEER_LOST, held against the message PeerError makes, as a traceback shows it."""
    from gradwire.transport import peer_error

    e = peer_error(12, op, 3, 336, why, 4.0).within("the header exchange before "
                                                     "allreduce/ring:pipeline=4")
    m = PEER_LOST.search(f"gradwire.errors.PeerError: {e}")
    assert m and (m[1], m[2]) == ("12", "3"), str(e)


RAISES = ("import os, time\nfrom gradwire.errors import PeerError\n"
          "if os.environ['RANK'] == '1':\n    time.sleep(60)\n"
          "raise PeerError(int(os.environ['RANK']), 1, 'receive of 8 bytes from', 'timed out')\n")


def test_a_rank_that_every_failed_rank_lost_is_named_as_stalled():
    """Ranks 0 and 2 end in a PeerError's traceback naming rank 1, which still runs: the run
    ends as soon as they have, naming rank 1."""
    t0 = time.monotonic()
    res, lines = _collect(loopback_cluster(3), [sys.executable, "-c", RAISES], timeout=60)
    assert res.message == "rank 1 stalled (ranks 0, 2 lost it); stopped the other ranks", lines
    assert res.returncode == 1 and time.monotonic() - t0 < 10


PID_REUSE = """
import re, subprocess, threading, time
from gradwire.cluster import loopback_cluster
from gradwire.launcher import launch

lines, res = [], {}
cmd = ["sh", "-c", 'if [ "$RANK" = 0 ]; then echo PID $$; exit 0; fi; sleep 3']
run = threading.Thread(target=lambda: res.setdefault(
    "r", launch(loopback_cluster(2), cmd, sink=lines.append)))
run.start()
while not any("PID" in x for x in lines):
    time.sleep(0.01)
pid = int(re.search(r"PID (\\d+)", next(x for x in lines if "PID" in x))[1])
time.sleep(1)  # rank 0 has exited; rank 1 runs on
# The next process made in this pid namespace gets rank 0's number, if that number is free.
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(pid - 1))
other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # another job's group
run.join()
time.sleep(0.2)
print("RUN", res["r"].returncode, "OTHER", other.poll())
other.kill()
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a pid namespace of its own)")
def test_a_rank_that_exits_early_gives_the_end_of_run_sweep_no_stranger_to_kill(tmp_path):
    """A rank that exited while others ran was reaped at once, its pid (its process group's
    number) free; a process group that took the number was SIGKILLed by the launcher's sweep
    at the end of the run, though the run succeeded. Run in a pid namespace of its own, where
    the test can hand the number on."""
    script = tmp_path / "pid_reuse.py"
    script.write_text(PID_REUSE)
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                        str(script)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[-4:] == ["RUN", "0", "OTHER", "None"], p.stdout + p.stderr


def test_output_stdout_cannot_encode_is_escaped_and_the_rank_lives_on():
    """A stdout that cannot encode a rank's character (here ASCII; the U+FFFD that stands
    for bytes that are not UTF-8 too): the reader died, and the rank with SIGPIPE."""
    rank = ('printf "caf\\303\\251 \\377\\n"; i=0; while [ $i -lt 3000 ]; do '
            'echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; echo END')
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gradwire", "run", "--loopback", "--hosts", "1",
                        "--timeout", "60", "--", "sh", "-c", rank], capture_output=True,
                       text=True, timeout=90, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "[rank 0] caf\\xe9 \\ufffd" and lines[-1] == "[rank 0] END"
    assert len(lines) == 3002 and time.monotonic() - t0 < 60


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), ValueError("bad")])
def test_a_sink_that_fails_stops_the_run_in_one_line_without_a_thread_traceback(error):
    """A sink that raises (a full disk under stdout, a caller's sink with a bug): its reader
    thread died with a traceback, and the run went on unseen until the timeout."""
    import threading

    traces: list[object] = []
    old, threading.excepthook = threading.excepthook, traces.append
    calls = []

    def sink(line: str) -> None:
        calls.append(line)
        if len(calls) == 2:
            raise error

    rank = "i=0; while [ $i -lt 5 ]; do echo line$i; i=$((i+1)); done; sleep 30"
    t0 = time.monotonic()
    try:
        res = launch(loopback_cluster(2), ["sh", "-c", rank], sink=sink, timeout=60)
    finally:
        threading.excepthook = old
    assert time.monotonic() - t0 < 20 and not traces
    assert res.returncode == 1 and "the ranks' output could not be handed on" in res.message
    assert type(error).__name__ in res.message
