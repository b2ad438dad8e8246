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
    t._device_type = None  # host tensors taken, as NCCL's would be GPU ones
    t.reset_counters()
    with pytest.raises(PeerError, match=r"^rank 0: send of 40 bytes to rank 1 failed: the "
                                        r"connection closed \(rank 1 exited"):
        t.batch([P2P("send", torch.zeros(10), 1), P2P("recv", torch.zeros(10), 1)])


@pytest.mark.parametrize("backend,device", [("gloo", "meta"), ("nccl", "cpu")])
def test_a_tensor_the_backend_cannot_send_is_refused_before_anything_is_posted(
        monkeypatch, backend, device):
    """gloo reads a GPU tensor's memory as host memory; NCCL fails on a host tensor without
    naming why: both are refused, naming the device the backend takes."""
    import torch
    import torch.distributed as dist

    from gradwire.errors import GradwireError
    from gradwire.transport import P2P, Transport

    def posted(*args, **kwargs):
        raise AssertionError("posted")

    for name in ("isend", "irecv", "batch_isend_irecv"):
        monkeypatch.setattr(dist, name, posted)
    t = Transport.__new__(Transport)  # a rank of two, without a process group
    t.group, t.rank, t.world_size, t.backend, t.timeout = None, 0, 2, backend, 5.0
    t._device_type = {"gloo": "cpu", "nccl": "cuda"}[backend]
    monkeypatch.setattr(Transport, "device", property(lambda self: torch.device(
        self._device_type)))
    t.reset_counters()
    x = torch.zeros(4, device=device)
    want = rf"^rank 0: {backend} sends {t._device_type} tensors, got one on {device}"
    for call in (lambda: t.isend(x, 1), lambda: t.irecv(x, 1),
                 lambda: t.batch([P2P("send", x, 1)])):
        with pytest.raises(GradwireError, match=want):
            call()
    assert t.bytes_sent == [0, 0] and t.bytes_received == [0, 0]
