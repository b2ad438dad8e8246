"""How long a rank program's ranks get to join, apart from their collectives' limit: bench's
(5 min) and calibrate's (10 min) ranks joined within that limit, so a rank that never came, or
a store that never answered, held the others for the watchdog's bound of it, about 18 and 33
minutes. They join within 60 s and keep the long limit once joined; the worker's ranks keep
getting --join-timeout where --timeout is shorter."""

import os
import subprocess
import sys
import textwrap

import pytest

from gradwire import rendezvous
from gradwire.bench import calibrate, rank
from gradwire.launcher import free_port
from gradwire.profiles import load
from gradwire.rendezvous import JOIN_S, stall_bound


class _Joined(Exception):
    pass


@pytest.fixture
def joins(monkeypatch):
    """Each join's c10d timeout and the watchdog's bound, the join itself stopped there."""
    seen: list[tuple[float, float]] = []
    bound: list[float] = []

    class Watchdog:
        def __init__(self, seconds, fd, line):
            bound.append(seconds)

        def cancel(self):
            pass

    def init(backend, timeout):
        seen.append((timeout.total_seconds(), bound[-1]))
        raise _Joined

    monkeypatch.setattr(rendezvous, "_Watchdog", Watchdog)
    monkeypatch.setattr(rendezvous.dist, "init_process_group", init)
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    return seen


def test_bench_ranks_join_within_a_minute_whatever_their_collective_limit(joins):
    with pytest.raises(_Joined):
        rank.main(["--collective", "allreduce", "--algos", '[{"label": "ring", "name": "ring",'
                   ' "params": {}}]', "--sizes", "1024", "--out", "/dev/null"])
    assert joins == [(JOIN_S, stall_bound(JOIN_S))]
    assert stall_bound(JOIN_S) < 7 * 60 < stall_bound(300)


def test_calibrate_ranks_join_within_a_minute_whatever_their_collective_limit(joins, tmp_path):
    with pytest.raises(_Joined):
        calibrate.run(tmp_path / "cal.json", load("resnet20"), "resnet20", 0.01, 0, "cpu",
                      "test")
    assert joins == [(JOIN_S, stall_bound(JOIN_S))]


RAISED = textwrap.dedent("""
    import sys, time
    import torch.distributed as dist
    from gradwire.rendezvous import join_world
    join_world("gloo", 60, join=2)
    if dist.get_rank() == 1:
        time.sleep(5)  # longer than the join's limit, well within the collectives'
    t0 = time.monotonic()
    dist.barrier()
    print(f"BARRIER {time.monotonic() - t0:.1f}")
""")


def test_the_joined_group_takes_the_longer_collective_limit():
    port = free_port()
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    procs = [subprocess.Popen([sys.executable, "-c", RAISED], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err
    assert float(outs[0][0].split()[1]) > 2, outs[0]  # rank 0 waited past the join's 2 s
