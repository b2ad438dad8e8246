import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import alive, cli_error, gradwire_leftovers, needs_netns, pids_in, script

from gradwire.cluster import ephemeral_cluster, loopback_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import MALLOC_TUNABLES, PEER_LOST, launch


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
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1


@pytest.mark.parametrize("given", [None, "", "glibc.malloc.arena_max=2"])
def test_ranks_get_the_allocator_setting_unless_the_caller_chose_one(monkeypatch, given):
    """GLIBC_TUNABLES: gradwire's (huge pages, no unmapping of freed buffers) by default;
    whatever the caller set, an empty value (glibc's defaults) included, otherwise."""
    if given is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", given)
    res, lines = _collect(loopback_cluster(2), script("echo_env.py"), timeout=60)
    assert res.returncode == 0, lines
    want = MALLOC_TUNABLES if given is None else given
    assert [e["GLIBC_TUNABLES"] for e in _envs(lines).values()] == [want, want]


@pytest.mark.parametrize("code,expect", [("3", "rank 1 exited with status 3"),
                                         ("KILL", "rank 1 was killed by SIGKILL")])
def test_a_failing_rank_stops_the_others_and_is_named(code, expect):
    t0 = time.monotonic()
    res, lines = _collect(loopback_cluster(3), script("fail_rank.py"), timeout=60,
                          extra_env={"FAIL_RANK": "1", "FAIL_CODE": code})
    assert res.returncode != 0
    assert res.message.startswith(expect)
    assert time.monotonic() - t0 < 30  # the sleeping ranks were stopped, not waited for
    assert [e.returncode for e in res.exits if e.rank != 1] == [None, None]
    pids = pids_in(lines)
    assert len(pids) == 3 and not [pid for pid in pids if alive(pid)]  # stopped and reaped


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
def test_environment_inside_namespaces():
    with ephemeral_cluster(2, "1gbit") as c:
        res, lines = _collect(c, script("echo_env.py"), timeout=60)
        envs = _envs(lines)
        assert res.returncode == 0
        assert envs[1]["MASTER_ADDR"] == c.hosts[0].addr
        assert envs[1]["GLOO_SOCKET_IFNAME"] == "eth0"


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
    from gradwire.transport import _peer_error

    e = _peer_error(12, op, 3, 336, why, 4.0).within("the header exchange before "
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
