"""Edges of `gradwire bench` and `gradwire calibrate`: a --param that no algorithm would get,
the rank side's arguments that made wrong rows or a traceback per rank, and calibrate under a
launcher of one rank."""

import argparse
import json

import pytest
from conftest import Started, cli_error, one_line_cli_error, run_cli, start_here

from gradwire.bench import rank as bench_rank
from gradwire.errors import GradwireError

# ---- gradwire bench: a --param every algorithm that takes it overrides


def test_a_param_that_every_taker_sets_itself_is_refused(monkeypatch, capsys):
    """`--algo ring:pipeline=2 --param pipeline=4` ran the ring with pipeline=2 and nothing
    with 4: the option typed was dropped without a word."""
    start_here(monkeypatch, "gradwire.cli.bench", "cluster_for")
    code, _, err = run_cli(monkeypatch, capsys, [
        "bench", "--loopback", "--hosts", "2", "--sizes", "1K", "--algo", "ring:pipeline=2",
        "--param", "pipeline=4"], started=(Started,))
    one_line_cli_error(code, err, "--param pipeline", "ring:pipeline=2", "would reach none")
    # one algorithm that takes it without setting it is enough
    code, _, err = run_cli(monkeypatch, capsys, [
        "bench", "--loopback", "--hosts", "2", "--sizes", "1K", "--algo",
        "ring:pipeline=2,ring", "--param", "pipeline=4"], started=(Started,))
    assert code == 0, err


# ---- the rank side's arguments


def _rank_args(**kw) -> argparse.Namespace:
    d = {"collective": "allreduce", "iters": 1, "batch": 1, "warmup": 0, "sizes": "1024",
         "op": "sum", "dtype": "float32",
         "algos": json.dumps([{"label": "ring", "name": "ring", "params": {}}])}
    return argparse.Namespace(**{**d, **kw})


@pytest.mark.parametrize("kw, msg", [
    # the builtin broadcast divided its output by P and counted every element wrong
    ({"collective": "broadcast", "op": "avg",
      "algos": json.dumps([{"label": "builtin", "name": "builtin", "params": {}}])},
     "--op avg applies to"),
    # each rank's gradwire call refused an integer average in its own traceback
    ({"op": "avg", "dtype": "int64"}, "--op avg needs a float --dtype"),
    # each rank failed with a TypeError from **params, or the algorithm's own traceback
    ({"algos": json.dumps([{"label": "ring", "name": "ring", "params": []}])},
     "expected a JSON list"),
    ({"algos": json.dumps([{"label": "ring", "name": "ring", "params": {"pipeline": "x"}}])},
     "algorithm 'ring'"),
    ({"algos": json.dumps([{"label": "ring", "name": "ring", "params": {"nope": 1}}])},
     "no parameter 'nope'"),
    ({"algos": json.dumps([{"label": "builtin", "name": "builtin", "params": {"a": 1}}])},
     "builtin baseline takes no parameters"),
    # argparse's choices took one dtype and one op; a list is checked name by name
    ({"dtype": "float32,int16"}, "--dtype 'int16' is not supported"),
    ({"op": "sum,band"}, "--op 'band' is not supported"),
])
def test_the_rank_side_checks_op_and_algorithm_parameters(kw, msg):
    with pytest.raises(GradwireError, match=msg):
        bench_rank.check_args(_rank_args(**kw))
    bench_rank.check_args(_rank_args())  # the arguments gradwire bench sends pass


def test_the_rank_side_runs_each_dtypes_ops_as_gradwire_bench_counts_them():
    *_, runs = bench_rank.check_args(_rank_args(dtype="int8,bfloat16", op="avg,min"))
    assert runs == [("int8", "min"), ("bfloat16", "avg"), ("bfloat16", "min")]


# ---- gradwire calibrate under a launcher of one rank


def test_calibrate_under_a_launcher_of_one_rank_is_one_line(monkeypatch, capsys, tmp_path):
    """It ended with a bare SystemExit: exit 1 and no `gradwire: error:` line."""
    import torch.distributed as dist

    from gradwire.launcher import free_port

    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(k, v)
    out = tmp_path / "cal.json"
    code, err = cli_error(monkeypatch, capsys, "calibrate", "--out", str(out), "--device", "cpu")
    one_line_cli_error(code, err, "needs at least 2 ranks")
    assert not dist.is_initialized() and not out.exists()


def test_no_builtin_with_builtin_listed_in_algo_is_refused(monkeypatch, capsys):
    """`--no-builtin --algo ring,builtin` ran torch.distributed's row all the same: the option
    typed was dropped without a word."""
    start_here(monkeypatch, "gradwire.cli.bench", "cluster_for")
    code, _, err = run_cli(monkeypatch, capsys, [
        "bench", "--loopback", "--hosts", "2", "--sizes", "1K", "--algo", "ring,builtin",
        "--no-builtin"], started=(Started,))
    one_line_cli_error(code, err, "--no-builtin conflicts with --algo 'ring,builtin'")
    for ok in (["--algo", "ring", "--no-builtin"], ["--algo", "ring,builtin"]):
        code, _, err = run_cli(monkeypatch, capsys, [
            "bench", "--loopback", "--hosts", "2", "--sizes", "1K", *ok], started=(Started,))
        assert code == 0, err


# ---- a bench that fails part way shows what it measured before


def test_a_bench_that_fails_part_way_shows_the_rows_measured_before(monkeypatch, capsys):
    """Rank 0 reports each row as it is measured; a rank that failed at the second size lost
    the first size's row with the rest, where nccl-tests would have printed it."""
    import gradwire.jobs
    from gradwire.launcher import RunResult

    row = {"collective": "allreduce", "algo": "ring", "name": "ring", "params": {},
           "count": 256, "bytes": 1024, "type": "float32", "redop": "sum", "time_s": 2e-3,
           "wrong": 0, "header": False}

    def fails_at_the_second_size(cluster, cmd, timeout, sink):
        sink(f"[rank 0] GW_BENCH {json.dumps(row)}")
        sink("[rank 0] GW_BENCH {\"cut\": ")  # a line another thread wrote into: not a row
        sink("[rank 1] killed")
        return RunResult(1, "rank 1 exited with code 1", [])

    monkeypatch.setattr(gradwire.jobs, "launch", fails_at_the_second_size)
    code, out, err = run_cli(monkeypatch, capsys, [
        "bench", "--loopback", "--hosts", "2", "--sizes", "1K,2K", "--algo", "ring",
        "--no-builtin"])
    assert code == 2 and "bench allreduce failed: rank 1 exited with code 1" in err
    assert "1 of 2 rows measured before the failure" in " ".join(out.split())
