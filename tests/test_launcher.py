import json
import time

import pytest
from conftest import gradwire_leftovers, needs_netns, script

from gradwire.cluster import ephemeral_cluster, loopback_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import MALLOC_TUNABLES, launch


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
    res, _ = _collect(loopback_cluster(3), script("fail_rank.py"), timeout=60,
                      extra_env={"FAIL_RANK": "1", "FAIL_CODE": code})
    assert res.returncode != 0
    assert res.message.startswith(expect)
    assert time.monotonic() - t0 < 30  # the sleeping ranks were stopped, not waited for
    assert [e.returncode for e in res.exits if e.rank != 1] == [None, None]


def test_timeout_stops_everything():
    res, _ = _collect(loopback_cluster(2), ["sleep", "30"], timeout=0.5)
    assert res.returncode == 124 and "timed out after 0.5 s" in res.message


@pytest.mark.parametrize("cmd,timeout,msg", [([], None, "no command given"),
                                             (["true"], 0, "--timeout must be a positive number"),
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
