"""NCCL with CUDA tensors: the check scripts the gloo tests run (every collective algorithm
against torch.distributed's own and the schedule's bytes, the sparse allreduces against the
long-hand reference, every DDP hook method), on one GPU, for several ranks. The launcher gives
each emulated host its own NCCL host id, so NCCL connects ranks that share the GPU over
sockets, as it would separate hosts. Skipped without CUDA (CI has none); the committed run is
benchmarks/results/nccl_check/latest.json (benchmarks/nccl_check.py)."""
import pytest
import torch
import torch.distributed as dist
from conftest import run_checks

from gradwire.cluster import loopback_cluster
from gradwire.launcher import rank_env

needs_nccl = pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()),
                                reason="needs a CUDA device and NCCL")
SCRIPTS = ["collectives_check.py", "sparse_check.py", "hooks_check.py", "syncfree_check.py"]


@needs_nccl
@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("name", SCRIPTS)
def test_checks_pass_over_nccl(name, p, monkeypatch):
    monkeypatch.setenv("GRADWIRE_TEST_BACKEND", "nccl")
    run_checks(name, p, timeout=600)


@pytest.mark.parametrize("name", ["sparse_check.py", "hooks_check.py"])
def test_single_rank_checks_pass_over_gloo(name):
    """The scripts' single-rank case, which the NCCL tests start with, checked without a GPU
    (collectives_check.py's runs in test_collectives_exec.py)."""
    run_checks(name, 1, timeout=300)


def test_every_emulated_host_is_its_own_nccl_host():
    """Two ranks with one NCCL host id on one GPU are refused ("Duplicate GPU detected"), and
    NCCL would send between them through shared memory, not over their link."""
    cluster = loopback_cluster(3)
    envs = [rank_env(cluster, r, 29500) for r in range(3)]
    assert len({e["NCCL_HOSTID"] for e in envs}) == 3
    assert all(e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == "lo" for e in envs)
