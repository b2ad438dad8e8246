"""Promises docs/cluster.md, docs/algorithms.md, docs/performance-model.md and
docs/simulator.md make to a user that no other test checked: the loopback fallback of
`gradwire run` and the environment its ranks get, `cluster down --all` under a Ctrl-C or
SIGTERM, int8 reductions of `gradwire.collectives`, the sparse aggregations taking their turn
among a group's calls, bench's hints for nccl-tests' -m and -o, the model's ring across nodes,
and `gradwire simulate`'s --seed and --timeline."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import cli_error, one_line_cli_error, run_cli, run_world, strict_json

from gradwire.cluster import netns
from gradwire.cluster.state import LOOPBACK_LABEL
from gradwire.sim import trace as tr

# ---- docs/cluster.md: the loopback fallback and the launcher's environment

ENV_KEYS = ["GLOO_SOCKET_IFNAME", "MASTER_ADDR", "GRADWIRE_NETWORK", "OMP_NUM_THREADS"]


@pytest.mark.parametrize("omp", [None, "3"])
def test_run_without_namespaces_falls_back_to_loopback_and_says_why_in_one_line(
        monkeypatch, capsys, omp):
    """cluster.md: without namespace support `gradwire run` says why on one line and runs every
    rank on 127.0.0.1 (GLOO_SOCKET_IFNAME=lo); each rank gets OMP_NUM_THREADS=1 unless set,
    and GRADWIRE_NETWORK, the label reports print."""
    import gradwire.cli.options

    monkeypatch.setattr(gradwire.cli.options, "netns_available",
                        lambda: (False, "network namespaces need root"))
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    show = ("import json, os; "
            f"print('ENV', json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS}}}))")
    code, out, err = run_cli(monkeypatch, capsys, ["run", "--hosts", "2", "--", sys.executable,
                                                   "-c", show])
    assert code == 0, (out, err)
    said = [line for line in err.splitlines() if line.strip()]
    assert said == [f"gradwire: network namespaces need root; falling back to {LOOPBACK_LABEL}"]
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in out.splitlines() if "ENV " in line]
    assert len(envs) == 2
    for e in envs:
        assert e == {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
                     "GRADWIRE_NETWORK": "loopback, links not shaped",
                     "OMP_NUM_THREADS": omp or "1"}


# ---- docs/cluster.md: `cluster down --all` holds a Ctrl-C or SIGTERM back

@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_down_all_removes_every_cluster_before_a_stop_signal_takes_effect(
        monkeypatch, capsys, tmp_path, sig, status):
    """A signal that comes while the first of three clusters is being removed waits until
    the other two are removed too, then ends the command as that signal. Nothing real is
    removed: the state folder is this test's, the machine's namespaces are not listed."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    names = ["gw0000a1", "gw0000a2", "gw0000a3"]
    for n in names:
        (tmp_path / f"{n}.json").write_text("{}")
    removed: list[str] = []

    def remove(name: str) -> None:
        if not removed:
            signal.raise_signal(sig)
        removed.append(name)

    # `ip netns list` reads empty here, and so does /etc/netns: another run's clusters and
    # probes are not this test's (a cluster up beside it was counted as a fourth)
    monkeypatch.setattr(netns, "_run", lambda cmd, *a, **kw: subprocess.CompletedProcess(
        cmd, 0, stdout="", stderr=""))
    monkeypatch.setattr(netns, "clusters_with_hosts_files", set)
    monkeypatch.setattr(netns, "_remove", remove)
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "down", "--all"])
    assert removed == names
    assert code == status, (out, err)


# ---- docs/algorithms.md: reductions take int8

def _int8(rank: int, p: int) -> dict:
    import gradwire.collectives as gc
    from gradwire.errors import GradwireError

    seen: dict = {}
    for algo in ("ring", "rhd", "tree"):
        x = torch.tensor([rank + 1, -rank, 3, 0, 5], dtype=torch.int8)
        gc.all_reduce(x, algo=algo)
        seen[f"allreduce {algo}"] = [x.dtype == torch.int8, x.tolist()]
    y = torch.full((4,), rank + 1, dtype=torch.int8)
    gc.reduce(y, dst=1)
    if rank == 1:  # c10d leaves the other ranks' tensors unspecified
        seen["reduce"] = y.tolist()
    out = torch.zeros(2, dtype=torch.int8)
    gc.reduce_scatter_tensor(out, torch.arange(2 * p, dtype=torch.int8) + rank)
    seen["reduce_scatter"] = out.tolist()
    try:
        gc.all_reduce(torch.ones(3, dtype=torch.int8), op="avg")
        seen["avg"] = "ran"
    except GradwireError as e:
        seen["avg"] = str(e)
    return seen


def test_reductions_take_int8(tmp_path):
    """algorithms.md: reductions take float tensors and int8 (the sum stays int8); an
    average of int8 is refused in one line on every rank."""
    p = 3
    seen = run_world(_int8, p, tmp_path)
    for rank, s in enumerate(seen):
        for algo in ("ring", "rhd", "tree"):
            assert s[f"allreduce {algo}"] == [True, [6, -3, 9, 0, 15]], (rank, algo)
        if rank == 1:
            assert s["reduce"] == [6] * 4
        # element i of the input sums to p·i + 0 + 1 + 2; rank r gets elements 2r, 2r + 1
        assert s["reduce_scatter"] == [p * (2 * rank) + 3, p * (2 * rank + 1) + 3]
        assert "\n" not in s["avg"] and "op 'avg' needs a float tensor" in s["avg"], s["avg"]


# ---- docs/algorithms.md: the sparse aggregations take their turn among a group's calls

def _sparse_in_turn(rank: int, p: int) -> dict:
    import gradwire.collectives as gc
    from gradwire.sparse import gtopk_allreduce, topk_allreduce

    got = {}
    for name, call in (("topk", lambda i: topk_allreduce(torch.tensor([1.0, 2.0]), i, 8)),
                       ("gtopk", lambda i: gtopk_allreduce(torch.tensor([1.0, 2.0]), i, 8,
                                                           torch.zeros(8)))):
        # every rank but 1 holds placeholder indices until rank 1's broadcast of its own
        # lands; rank 1 comes late, so the broadcast is still in flight on the others when
        # they issue the aggregation
        idx = torch.tensor([3, 4]) if rank == 1 else torch.tensor([0, 0])
        if rank == 1:
            time.sleep(1.0)
        h = gc.broadcast(idx, src=1, async_op=True)
        out = call(idx)
        h.wait()
        got[name] = {"indices": sorted(out.entries.indices.tolist()),
                     "values": sorted(out.entries.values.tolist())}
    return got


def test_a_sparse_aggregation_reads_its_input_in_issue_order(tmp_path):
    """algorithms.md: a group's calls run in the order they were issued, async or not, the
    sparse aggregations of gradwire.sparse among them: a topk_allreduce or gtopk_allreduce
    issued after an async broadcast of its indices aggregates the broadcast indices on every
    rank. They checked (and read) their indices before their turn: rank 0 aggregated its
    placeholder [0, 0]."""
    seen = run_world(_sparse_in_turn, 2, tmp_path)
    want = {"indices": [3, 4], "values": [2.0, 4.0]}
    assert seen == [{"topk": want, "gtopk": want}] * 2


# ---- docs/algorithms.md: nccl-tests' short options name bench's own

@pytest.mark.parametrize("args,hint", [
    (["-m", "4"], "No such option: -m; nccl-tests' -m (calls aggregated in one group) has "
                  "no counterpart; its -n, the calls timed back to back, is --batch here"),
    (["-o", "avg"], "No such option: -o; nccl-tests' -o is --op here"),
])
def test_nccl_tests_batch_and_op_options_name_benchs_own(monkeypatch, capsys, args, hint):
    code, err = cli_error(monkeypatch, capsys, "bench", *args)
    one_line_cli_error(code, err, hint)


# ---- docs/performance-model.md: ranks per node

def _whatif(monkeypatch, capsys, tmp_path, per_node: int) -> dict:
    out = tmp_path / f"g{per_node}.json"
    code, _, err = run_cli(monkeypatch, capsys, [
        "whatif", "--model", "resnet50", "--workers", "8", "--bandwidth", "1gbit",
        "--agg", "dense,fp16,topk", "--ranks-per-node", str(per_node), "--json", str(out)])
    assert code == 0, err
    return {r["agg"]: r for r in json.loads(out.read_text())["rows"]}


def test_a_ring_costs_the_same_with_two_ranks_per_node(monkeypatch, capsys, tmp_path):
    """performance-model.md: a ring sends one message per node per step, so G = 2 costs what
    G = 1 does; a butterfly's steps across nodes carry G ranks' bytes through each link
    (Top-k's allgather: recursive doubling at P = 8)."""
    one = _whatif(monkeypatch, capsys, tmp_path, 1)
    two = _whatif(monkeypatch, capsys, tmp_path, 2)
    for agg in ("dense", "fp16"):  # ring allreduces
        assert two[agg]["communicate_s"] == one[agg]["communicate_s"], agg
        assert two[agg]["iteration_s"] == one[agg]["iteration_s"], agg
    topk = next(a for a in one if a.startswith("topk"))
    assert two[topk]["communicate_s"] > one[topk]["communicate_s"]


# ---- docs/simulator.md: --seed

def test_simulate_draws_recorded_iterations_with_the_seed_and_repeats_itself(
        monkeypatch, capsys, tmp_path):
    """simulator.md: each simulated (worker, iteration) replays a recorded one drawn with
    --seed, and a simulation is deterministic for a seed: the same seed gives the same
    results, another seed another draw; --json records the seed."""
    t = tr.synthetic("v", [4096, 4096], 0.01, 0.02)
    # six recorded iterations whose compute differs, two workers' three each
    its = [tr.Iteration(w, i, f, (0.0, f / 2), (2 * f, f))
           for w in range(2) for i, f in enumerate(0.01 * (1 + 3 * w + i) for i in range(3))]
    path = tr.save(tr.Trace(t.model, t.params, tuple(its), t.source),
                   tmp_path / "v.trace.jsonl")

    def simulate(seed: int, name: str) -> dict:
        out = tmp_path / name
        code, _, err = run_cli(monkeypatch, capsys, [
            "simulate", "--trace", str(path), "--workers", "4", "--bandwidth", "10gbit",
            "--mechanism", "ps,ring", "--seed", str(seed), "--json", str(out)])
        assert code == 0, err
        return json.loads(out.read_text())

    first, again, other = simulate(1, "a.json"), simulate(1, "b.json"), simulate(0, "c.json")
    assert first["cluster"]["seed"] == 1 and other["cluster"]["seed"] == 0
    def simulated(doc: dict) -> list[dict]:  # without wall_s, the machine's time
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in doc["results"]]

    assert simulated(first) == simulated(again)
    assert [r["compute_s"] for r in first["results"]] != [r["compute_s"]
                                                          for r in other["results"]]


# ---- docs/simulator.md: --timeline

def test_the_timeline_has_a_process_per_host_and_mechanism_compute_on_thread_0(
        monkeypatch, capsys, tmp_path):
    """simulator.md: one process per host and mechanism, compute on thread 0, the flows a host
    sends on thread 1; host h of the k-th mechanism (from 0) is process k × 1000 + h."""
    path = tr.save(tr.synthetic("m", [4096, 8192, 4096], 0.01, 0.02), tmp_path / "m.jsonl")
    out = tmp_path / "tl.json"
    code, _, err = run_cli(monkeypatch, capsys, [
        "simulate", "--trace", str(path), "--workers", "3", "--bandwidth", "10gbit",
        "--mechanism", "ps,ring", "--iterations", "2", "--timeline", str(out)])
    assert code == 0, err
    events = strict_json(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {0: "ps: worker 0", 1: "ps: worker 1", 2: "ps: worker 2", 3: "ps: server 0",
                     1000: "ring: worker 0", 1001: "ring: worker 1", 1002: "ring: worker 2"}
    spans = [e for e in events if e["ph"] != "M"]
    compute = [e for e in spans if e["name"].startswith(("forward", "backward"))]
    assert compute and {e["tid"] for e in compute} == {0}
    assert {e["pid"] for e in compute} == set(names) - {3}  # the server computes nothing
    sent = [e for e in spans if e not in compute]
    assert sent and {e["tid"] for e in sent} == {1}
    assert {e["pid"] for e in sent} == set(names)  # every host sends
