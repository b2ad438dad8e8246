import json
import os
import subprocess
import sys

import pytest
from conftest import needs_netns, script

from gradwire.cluster import ephemeral_cluster, loopback_cluster
from gradwire.launcher import launch


def _run(cluster, **env):
    lines: list[str] = []
    res = launch(cluster, script("p2p_exchange.py"), timeout=120, sink=lines.append,
                 extra_env={k: str(v) for k, v in env.items()})
    assert res.returncode == 0, "\n".join(lines[-30:])
    out = {}
    for line in lines:
        _, _, rest = line.partition("] ")
        if rest.startswith("COUNTERS "):
            d = json.loads(rest[len("COUNTERS "):])
            out[d["rank"]] = d
    return out


@pytest.mark.parametrize("seed,world,mode", [(0, 2, "batch"), (1, 3, "blocking"),
                                             (2, 4, "batch")])
def test_counters_equal_bytes_posted_per_peer(seed, world, mode):
    c = _run(loopback_cluster(world), SEED=seed, MODE=mode)
    assert sorted(c) == list(range(world))
    for r in range(world):
        assert c[r]["sent"] == c[r]["posted"]["sent"]
        assert c[r]["received"] == c[r]["posted"]["received"]
        for peer in range(world):
            assert c[r]["sent"][peer] == c[peer]["received"][r]
    assert sum(sum(c[r]["sent"]) for r in c) > 0


@needs_netns
def test_counters_on_the_emulated_cluster():
    with ephemeral_cluster(3, "1gbit") as cl:
        c = _run(cl, SEED=5, MODE="batch", MESSAGES=20)
    for r in range(3):
        assert c[r]["sent"] == c[r]["posted"]["sent"]


def test_the_same_script_runs_unchanged_under_torchrun():
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", *script("p2p_exchange.py")[1:]],
                       capture_output=True, text=True, timeout=120, env={
                           **os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("COUNTERS ") == 2


def test_a_failed_nccl_batch_post_is_a_peer_error(monkeypatch):
    """NCCL raises from batch_isend_irecv itself once a peer has failed (its communicator
    aborted): the rank gets a PeerError naming the peer, as from a failed wait."""
    import torch
    import torch.distributed as dist

    from gradwire.errors import PeerError
    from gradwire.transport import P2P, Transport

    def aborted(ops):
        raise RuntimeError("NCCL communicator was aborted on rank 0. Original reason: "
                           "Connection closed by remote peer")

    monkeypatch.setattr(dist, "batch_isend_irecv", aborted)
    monkeypatch.setattr(dist, "P2POp", lambda *op: op)  # its checks need a process group
    t = Transport.__new__(Transport)  # a rank of two under NCCL, without a GPU
    t.group, t.rank, t.world_size, t.backend, t.timeout = None, 0, 2, "nccl", 5.0
    t.reset_counters()
    with pytest.raises(PeerError, match=r"^rank 0: send of 40 bytes to rank 1 failed: the "
                                        r"connection closed \(rank 1 exited"):
        t.batch([P2P("send", torch.zeros(10), 1), P2P("recv", torch.zeros(10), 1)])
