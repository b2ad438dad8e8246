"""Edges of `gradwire bench`'s runner: the result check finds data in the wrong place, the
memory bound it suggests is one it takes, the contention note follows the cores, and the rank
side refuses bad arguments in one line."""

import io
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from gradwire.bench import rank as bench_rank
from gradwire.bench import spec
from gradwire.errors import GradwireError
from gradwire.sizes import parse_size

P, COUNT = 3, 24  # 8 elements a rank's block


def outputs(collective: str, dtype: torch.dtype = torch.float32):
    """Every rank's (correct output, expected output) of ``collective`` over P ranks in this
    process, the inputs as the rank side makes them."""
    made = [bench_rank._buffers(collective, COUNT, P, r, dtype) for r in range(P)]
    for _, _, reset, _ in made:
        reset()
    ins = [inp.clone() for inp, _, _, _ in made]
    total = sum(ins)
    per = COUNT // P
    right = {"allreduce": [total] * P, "reduce": [total] + [None] * (P - 1),
             "broadcast": [ins[0]] * P, "allgather": [torch.cat(ins)] * P,
             "reducescatter": [total[r * per : (r + 1) * per] for r in range(P)]}[collective]
    return [(got, want) for got, (_, _, _, want) in zip(right, made, strict=True)]


@pytest.mark.parametrize("collective", ["allreduce", "reduce", "broadcast", "allgather",
                                        "reducescatter"])
def test_an_output_one_element_out_of_place_is_wrong(collective):
    """Inputs equal at every position made any permutation of the output pass the check."""
    per = COUNT // P
    for got, want in outputs(collective):
        if want is None:  # reduce: the other ranks' buffers are scratch
            continue
        assert torch.equal(got, want)
        # shifted within each rank's block, so that the blocks themselves stay in place
        shifted = got.view(-1, per).roll(1, dims=1).flatten() if got.numel() == COUNT else (
            got.roll(1))
        assert int((shifted != want).sum()) > 0


def test_a_reduce_scatter_that_hands_a_rank_another_ranks_block_is_wrong():
    per = COUNT // P
    made = [bench_rank._buffers("reducescatter", COUNT, P, r, torch.float32) for r in range(P)]
    total = sum(inp for inp, _, _, _ in made)
    for r, (_, _, _, want) in enumerate(made):
        other = (r + 1) % P
        assert torch.equal(total[r * per : (r + 1) * per], want)
        assert not torch.equal(total[other * per : (other + 1) * per], want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [22, 64, 250])
def test_the_checked_data_vary_by_position_and_their_sums_stay_exact(dtype, p):
    """The weights scale the inputs by up to 8: the largest sum the check expects, in the
    largest world, is still an exact, finite value of the dtype."""
    made = [bench_rank._buffers("allreduce", 64, p, r, dtype) for r in range(p)]
    for _, _, reset, _ in made:
        reset()
    exact = sum(inp.double() for inp, _, _, _ in made)
    want = made[0][3]
    assert len(set(want.tolist())) > 1
    assert torch.isfinite(want).all() and torch.equal(want.double(), exact)


@pytest.mark.parametrize("most, bound", [(1944 * 2**20 + 600 * 2**10, "1944M"),
                                         (300 * 2**10 + 5, "300K")])
def test_the_largest_size_bench_suggests_is_one_it_takes(monkeypatch, most, bound):
    """The bound was rounded to the nearest M: 1944.6M read "1945M", which the same check
    refuses, and anything under half a megabyte read "0M"."""
    p = 4
    have = most * spec.BUFFERS_PER_RANK * p
    monkeypatch.setattr(spec, "available_memory", lambda device: (have, "available"))
    with pytest.raises(GradwireError, match=f"expected sizes up to {bound}$"):
        spec.check_sizes([4, 2**40], "float32", p, "cpu")
    spec.check_sizes([4, parse_size(bound)], "float32", p, "cpu")


def test_the_gpu_bound_is_its_free_memory_not_its_total(monkeypatch):
    """The check for --device cuda took GPU 0's total memory: sizes that another process's
    tensors left no room for passed it, and every rank died of out-of-memory instead."""
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 80 * 2**30))
    assert spec.available_memory("cuda") == (2**30, "GPU 0's free")
    with pytest.raises(GradwireError, match="1 GiB of GPU 0's free memory"):
        spec.check_sizes([4, 2**28], "float32", 4, "cuda")


@pytest.mark.parametrize("hosts, cores, noted", [(4, 2, True), (9, 64, False), (2, 2, False)])
def test_the_contention_note_follows_the_cores(monkeypatch, tmp_path, hosts, cores, noted):
    """The note said ranks shared the cores from 9 ranks on, whatever the machine: none for
    4 ranks on 2 cores, one for 9 ranks on 64."""
    from rich.console import Console

    from gradwire.bench import run as bench_run
    from gradwire.bench.spec import parse_specs
    from gradwire.cluster import loopback_cluster

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    monkeypatch.setattr(bench_run, "run_ranks", lambda *a, **k: [])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    shown = io.StringIO()
    bench_run.run_bench(loopback_cluster(hosts), "allreduce", parse_specs("allreduce", "ring"),
                        [1024], ["float32"], 1, 0, {}, False, 60, Console(file=shown, width=200))
    note = f"note: {hosts} ranks share {cores} cores"
    assert (note in shown.getvalue()) == noted, shown.getvalue()


RING = json.dumps([{"label": "ring", "name": "ring", "params": {}}])


@pytest.mark.parametrize("args, msg", [
    (["--iters", "0"], "--iters must be at least 1, got 0"),
    (["--batch", "0"], "--batch must be at least 1, got 0"),
    (["--warmup", "-1"], "--warmup must be at least 0, got -1"),
    (["--sizes", "1K"], "--sizes '1K': expected a comma list of bytes, each 1 or more"),
    (["--sizes", "0"], "--sizes '0': expected a comma list of bytes"),
    (["--algos", "ring"], "--algos 'ring': expected a JSON list of {label, name, params}"),
    (["--algos", "[]"], "expected a JSON list"),
    (["--algos", '[{"label": "x", "name": "nope", "params": {}}]'],
     "unknown allreduce algorithm 'nope'"),
    (["--collective", "allreduce2"], "unknown collective 'allreduce2'"),
])
def test_the_rank_side_refuses_bad_arguments_in_one_line(capsys, args, msg):
    """Before, each rank went on to join the process group with them and failed with a
    traceback: --iters 0 only after the first size's calls, --batch 0 dividing by zero."""
    with pytest.raises(SystemExit) as e:
        bench_rank.main(["--collective", "allreduce", "--algos", RING, "--sizes", "1024",
                         "--out", "x.json", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and msg in err[-1], err


def test_a_size_that_holds_no_element_per_rank_is_one_line_on_the_rank_side(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    p = subprocess.run([sys.executable, "-m", "gradwire.bench.rank", "--collective",
                        "allgather", "--algos", RING, "--sizes", "2,1024", "--out",
                        str(tmp_path / "x.json")], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert ("--sizes: 2 bytes hold no float32 element for each of 1 ranks: expected sizes of "
            "at least 4 bytes") in p.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x.json").exists()


def test_one_rank_s_calls_have_no_model_error_not_minus_100_percent():
    """With one rank the model prices nothing to send at 0 s; the table showed -100.0 %."""
    from gradwire.bench.report import annotate
    from gradwire.schedules.cost import CostParams

    rows = [{"collective": "allreduce", "name": "ring", "params": {}, "count": 256,
             "bytes": 1024, "time_s": 2e-6, "redop": "sum", "header": False}]
    annotate(rows, 1, CostParams.for_link(1e9))
    assert rows[0]["predicted_s"] == 0.0 and rows[0]["prediction_error"] is None
    rows[0]["time_s"] = 1e-3
    annotate(rows, 2, CostParams.for_link(1e9))
    assert rows[0]["predicted_s"] > 0 and rows[0]["prediction_error"] is not None


def test_runs_taking_turns_alternate_call_by_call(one_rank):
    """The benchmarks' ratios are of calls made under the same conditions: round by round,
    one call of each run (after its own untimed lead-in where asked), not every call of one
    run before the next starts."""
    from gradwire.bench.rank import taking_turns

    calls: list[str] = []
    times = taking_turns([lambda: calls.append("a"), lambda: calls.append("b")], 2, 1)
    assert calls == ["a", "b"] * 3 and [len(t) for t in times] == [2, 2]
    calls.clear()
    taking_turns([lambda: calls.append("a"), lambda: calls.append("b")], 1, 0, lead_in=True)
    assert calls == ["a", "a", "b", "b"]
