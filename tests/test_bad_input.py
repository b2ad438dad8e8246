"""Bad input, across the CLI and the Python API: one clear line, exit 2 (CLI) or a GradwireError
(API), never a traceback, never anything built. The CLI runs in this process (cli.main()), so
the ~60 cases take about a second. Inputs that need a live cluster or a run stay with their
feature's tests (test_train: checkpoints; test_cluster: cluster_up)."""
import datetime
import json
import math
import os
import stat
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import cli_error, strict_json
from hypothesis import given
from hypothesis import strategies as st

import gradwire.collectives as gc
import gradwire.hooks as gh
from gradwire.bandwidth import parse_bandwidth
from gradwire.bench import calibrate
from gradwire.cluster import list_clusters, load_cluster, loopback_cluster
from gradwire.compress import get as get_compressor
from gradwire.errors import GradwireError
from gradwire.profiles.measure import measure
from gradwire.schedules import registry
from gradwire.sim.cluster import SimCluster
from gradwire.sparse import gtopk_allreduce, sparse_allreduce, topk_allreduce
from gradwire.train import checkpoint
from gradwire.transport import Transport

LOOP = ["--loopback"]
CLI = [
    # gradwire run
    (["run", "--hosts", "0", "--", "true"], "Invalid value for '--hosts'"),
    (["run", "--bandwidth", "1gb", "--", "true"], "bandwidth '1gb' is not valid"),
    (["run", "--bandwidth", "-5mbit", "--", "true"], "bandwidth '-5mbit' is not valid"),
    (["run", "--bandwidth", "0gbit", "--", "true"], "bandwidth '0gbit' is out of range"),
    (["run", *LOOP, "--timeout", "0", "--", "true"], "--timeout must be a number of seconds"),
    (["run", *LOOP, "--timeout", "-1", "--", "true"], "--timeout must be a number of seconds"),
    (["run", *LOOP, "--timeout", "soon", "--", "true"], "Invalid value for '--timeout'"),
    (["run", *LOOP], "Missing argument"),
    (["run", "--cluster", "gwzzzzzz", "--", "true"], "cluster name 'gwzzzzzz' is not valid"),
    (["run", "--cluster", "gw;rm -rf", "--", "true"], "is not valid"),
    (["rnu"], "No such command 'rnu'"),
    # gradwire cluster
    (["cluster", "up", "--hosts", "0"], "Invalid value for '--hosts'"),
    (["cluster", "up", "--hosts", "251"], "--hosts must be between 1 and 250"),
    (["cluster", "up", "--bandwidth", "fast"], "bandwidth 'fast' is not valid"),
    (["cluster", "up", "--hosts", "2", "--name", "x;rm"], "cluster name 'x;rm' is not valid"),
    (["cluster", "up", "--name", "gw12345"], "cluster name 'gw12345' is not valid"),
    (["cluster", "up", "--name", "gw123456 x"], "is not valid"),
    (["cluster", "up", "--mtu", "100"], "--mtu must be an integer number of bytes from 576"),
    (["cluster", "up", "--mtu", "65536"], "--mtu must be an integer number of bytes"),
    (["cluster", "up", "--mtu", "jumbo"], "Invalid value for '--mtu'"),
    (["run", *LOOP, "--mtu", "70000", "--", "true"], "--mtu must be an integer number of bytes"),
    (["cluster", "down", "../../etc"], "cluster name '../../etc' is not valid"),
    (["cluster", "down", "gw;reboot"], "is not valid"),
    (["cluster", "stauts"], "No such command 'stauts'"),
    # gradwire demo
    (["demo", "--bandwidth", "fast"], "bandwidth 'fast' is not valid"),
    (["demo", "--agg", "nope"], "unknown aggregation 'nope'"),
    (["demo", "--agg", "gtpok"], "did you mean 'gtopk'"),
    (["demo", "--agg", " , "], "--agg is empty"),
    (["demo", "--model", "nope"], "unknown model 'nope'"),
    (["demo", "--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["demo", "--density", "0"], "--density must be in (0, 1], got 0"),
    (["demo", "--density", "2"], "--density must be in (0, 1], got 2"),
    (["demo", "--mode", "layer"], "--mode 'layer' is not valid"),
    (["demo", "--hosts", "-2"], "Invalid value for '--hosts'"),
    # gradwire train (more in test_train.py)
    (["train", "--density", "nan"], "--density must be in (0, 1], got nan"),
    (["train", "--density", "-0.5"], "--density must be in (0, 1]"),
    (["train", "--model", "resnet2"], "did you mean 'resnet20'"),
    (["train", "--lr", "-1"], "--lr must be a finite number > 0"),
    (["train", "--lr", "inf"], "--lr must be a finite number > 0"),
    (["train", "--momentum", "-0.1"], "--momentum must be in [0, 1)"),
    (["train", "--seq-len", "0"], "--seq-len must be from 1 to 4096, got 0"),
    (["train", "--batch-size", "0"], "must be from 1 to 65536, got 0"),
    (["train", "--model", "vgg16", "--batch-size", "1"], "--batch-size 1 is too small for vgg16"),
    (["demo", "--model", "resnet50", "--batch-size", "1"],
     "--batch-size 1 is too small for resnet50"),
    (["train", "--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
    (["train", "--densty", "0.1"], "No such option: --densty"),
    # gradwire bench and calibrate
    (["bench", "--algo", "rnig"], "did you mean 'ring'"),
    (["bench", "--collective", "alltoall"], "unknown collective 'alltoall'"),
    (["bench", "--sizes", "8K:1K"], "size range '8K:1K' is not valid"),
    (["bench", "--sizes", "lots"], "'lots' is not valid"),
    (["bench", "--param", "block"], "--param 'block' is not valid"),
    (["bench", "--param", "pipeline=2", "--param", "pipeline=3"],
     "--param 'pipeline=3': pipeline is given twice"),
    (["bench", "--algo", "ring:op=sum"],
     "algorithm 'ring:op=sum': op is bench's own (--op, --dtype), not an algorithm's parameter"),
    (["bench", "--algo", "ring:itemsize=2"], "itemsize is bench's own"),
    (["bench", "--algo", "ring:pipeline=2:pipeline=3"],
     "algorithm 'ring:pipeline=2:pipeline=3': parameter 'pipeline=3': pipeline is given twice"),
    (["bench", "--dtype", "int16"], "--dtype 'int16' is not supported: expected float32, "
     "float16, bfloat16, float64, int8, uint8, int32 or int64"),
    (["bench", "--dtype", "int32", "--op", "avg"], "--op avg needs a float --dtype (float32, "
     "float16, bfloat16 or float64), got int32: an integer sum is not divided; time --op sum"),
    (["bench", "--algo", "ring:blok=4"], "allreduce ring has no parameter 'blok'"),
    (["bench", "--algo", "ring,lp", "--param", "blok=4"],
     "--param blok: no algorithm of ring, lp takes it (did you mean 'block'?)"),
    (["bench", "--iters", "0"], "Invalid value for '--iters'"),
    (["bench", "--batch", "0"], "Invalid value for '--batch'"),
    (["bench", "--warmup", "-1"], "Invalid value for '--warmup'"),
    (["bench", "--bandwidth", "1gbps"], "bandwidth '1gbps' is not valid"),
    (["calibrate", "--hosts", "1"], "calibrate needs --hosts from 2 to 250, got 1"),
    # the cluster's own range, 1 to 250, had been named for a count calibrate never takes
    (["calibrate", "--hosts", "251"], "calibrate needs --hosts from 2 to 250, got 251"),
    # checked before any rank starts (each rank printed a traceback without naming the value)
    (["bench", "--algo", "ring:pipeline=abc"],
     "algorithm 'ring:pipeline=abc': allreduce ring: parameter pipeline='abc': expected an "
     "integer"),
    (["bench", "--algo", "ring:pipeline=-1"], "'ring:pipeline=-1': pipeline must be an int >= 1"),
    (["bench", "--param", "pipeline=-1"],
     "algorithm 'ring' with --param pipeline=-1: pipeline must be an int >= 1"),
    (["bench", "--algo", "lp", "--param", "alpha=nan"], "parameter alpha='nan': expected a finite"),
    (["bench", "--algo", "ps:servers=9"], "servers must be an int in 1..4"),
    # fine at the smallest size, too many blocks at the largest
    (["bench", "--collective", "broadcast", "--algo", "lp:block=1", "--sizes", "1K,1M"],
     "algorithm 'lp:block=1': block=1 cuts 262144 elements into 262144 blocks"),
    (["bench", "--sizes", "1024G"], "--sizes: 1024G is too large for 4 ranks on this machine"),
    (["bench", "--sizes", "0"], "size '0' is out of range: expected 1 or more"),
    (["bench", "--sizes", "1K,0"], "size '0' is out of range"),
    (["bench", "--sizes", "2"], "--sizes: 2 bytes hold no float32 element"),
    (["cluster", "down", "gw123456", "--all"], "give a cluster's name or --all, not both"),
    (["whatif", "--plot", "w.txt"], "--plot 'w.txt': name the figure's format by its extension"),
    (["whatif", "--plot", "w"], "--plot 'w': name the figure's format by its extension"),
    (["whatif", "--json", "r.png", "--plot", "r.png"], "--plot and --json name the same file"),
    (["bench", "--collective", "allgather", "--hosts", "4", "--loopback", "--sizes", "8,64"],
     "--sizes: 8 bytes hold no float32 element for each of 4 ranks"),
    (["bench", "--timeout", "nan"], "--timeout must be a number of seconds"),
    (["bench", "--hosts", "1000"], "--hosts must be between 1 and 250, got 1000"),
    (["calibrate", "--density", "2"], "--density must be in (0, 1], got 2"),
    (["calibrate", "--rank", "0"], "--rank (PowerSGD's) must be from 1 to 1024, got 0"),
    (["calibrate", "--model", "resnet5"], "unknown profile 'resnet5' (did you mean"),
    (["advise", "--model", "lstm"], "no built-in profile of 'lstm': measure one on the machine "
                                    "it will train on with `gradwire profile --model lstm"),
    (["whatif", "--model", "mlp"], "no built-in profile of 'mlp'"),
    (["calibrate", "--device", "tpu"], "--device 'tpu' is not supported"),
    (["calibrate", "--out", "/nonexistent-gw/c.json"], "--out '/nonexistent-gw/c.json'"),
    (["calibrate", "--mtu", "1"], "--mtu must be an integer number of bytes"),
    # ASCII digits only: int() and float() take other scripts' digits
    (["bench", "--bandwidth", "١gbit"], "bandwidth '١gbit' is not valid"),
    (["cluster", "up", "--bandwidth", "١gbit"], "bandwidth '١gbit' is not valid"),
    (["bench", "--sizes", "١K"], "size '١K' is not valid"),
    (["bench", "--sizes", "1K:8K:٢"], "size range '1K:8K:٢' is not valid"),
    (["bench", "--algo", "ring:pipeline=٤"], "parameter pipeline='٤': expected an integer"),
    (["whatif", "--compute-speedup", "١"], "--compute-speedup '١': '١' is not a number"),
    (["advise", "--compute-ms", "1,٢"], "--compute-ms '1,٢': '٢' is not a number"),
    # the model's terms: NaN passed every comparison and came out as NaN times
    (["advise", "--compute-speedup", "inf"], "--compute-speedup must be a finite number > 0"),
    (["advise", "--overlap-slowdown", "nan"], "--overlap-slowdown must be a finite number, got"),
    (["whatif", "--alpha-us", "inf"], "--alpha-us must be a finite number, got inf"),
    (["whatif", "--gamma-ns", "nan"], "--gamma-ns must be a finite number, got nan"),
    (["whatif", "--bucket-mb", "nan"], "--bucket-mb must be a finite number, got nan"),
    (["whatif", "--compute-speedup", "1_0"], "'1_0' is not a number"),
    # the bounds of options several commands share (torch failed with a traceback)
    (["train", "--seed", "99999999999999999999"], "--seed must be from 0 to 4294967295"),
    (["profile", "--model", "mlp", "--batch-size", "99999999999999"],
     "--batch-size must be from 1 to 65536"),
    (["profile", "--model", "lstm", "--seq-len", "1000000000"], "--seq-len must be from 1 to"),
    # output paths, refused before any work
    (["train", "--json", "/nonexistent-gw/x.json"], "folder '/nonexistent-gw' does not exist"),
    (["train", "--checkpoint", "/"], "--checkpoint '/' is a directory"),
    (["demo", "--plot", "/nonexistent-gw/d.png"], "--plot '/nonexistent-gw/d.png': folder"),
    (["bench", "--json", "/"], "--json '/' is a directory: give a file name"),
    (["whatif", "--plot", "/nonexistent-gw/w.png"], "folder '/nonexistent-gw' does not exist"),
    (["advise", "--json", "/"], "--json '/' is a directory"),
    (["profile", "--model", "mlp", "--out", "/nonexistent-gw/p.json"], "--out '/nonexistent-gw"),
    (["trace", "--model", "mlp", "-o", "/nonexistent-gw/t.jsonl"], "--out '/nonexistent-gw"),
    (["simulate", "--trace", "t.jsonl", "--timeline", "/nonexistent-gw/t.json"], "--timeline"),
    (["simulate", "--trace", "t.jsonl", "--plot", "p.png"], "--plot draws a --sweep"),
    (["simulate", "--trace", "t.jsonl", "--table", "4", "--sweep", "workers=4,8"],
     "--table 4 is a run of its own: not with --sweep"),
    (["simulate", "--trace", "t.jsonl", "--sweep", "workers=4,8", "--timeline", "t.json"],
     "--timeline records one plain run: not with --table or --sweep"),
    (["simulate", "--trace", "a.jsonl", "--trace", "b.jsonl"], "2 --trace files: only --table"),
    (["simulate", "--trace", "t.jsonl", "--calibration", "c.json", "--alpha-us", "5"],
     "--calibration gives α (the links' latency in it): not with --alpha-us or --latency-us"),
    # root may write into /proc as far as os.access says, until the kernel refuses the write;
    # a device such as /dev/full takes nothing, which only a write would show
    (["whatif", "--workers", "4", "--agg", "dense", "--json", "/proc/gw-x.json"],
     "--json '/proc/gw-x.json' is in /proc, a kernel file system"),
    (["whatif", "--json", "/proc/version"], "--json '/proc/version' is in /proc"),
    (["advise", "--json", "/dev/full"], "--json '/dev/full' is not a regular file"),
    (["bench", "--json", "/dev/full"], "--json '/dev/full' is not a regular file"),
    (["trace", "--model", "mlp", "-o", "/dev/full"], "--out '/dev/full' is not a regular file"),
    (["train", "--checkpoint", "/sys/gw.pt"], "--checkpoint '/sys/gw.pt' is in /sys"),
    # input files that are not regular files (/dev/zero was read until memory ran out)
    (["simulate", "--trace", "/dev/zero"], "cannot read trace /dev/zero: not a regular file"),
    (["whatif", "--calibration", "/dev/zero"], "--calibration /dev/zero: not a regular file"),
    (["advise", "--model", "/dev/zero"], "profile file '/dev/zero' is not a regular file"),
    # gradwire trace: refused before anything is recorded (10**8 layers ran out of memory)
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--add-layers", "100000000"],
     "--add-layers must be from 0 to 100000"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--compute-speedup", "inf"],
     "--compute-speedup must be a number from 1e-06 to 1e+06, got inf"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--compute-speedup", "nan"],
     "--compute-speedup must be a number from 1e-06 to 1e+06, got nan"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--compute-speedup", "0"],
     "--compute-speedup must be a number"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--compute-speedup", "-2"],
     "--compute-speedup must be a number"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--layer-forward-ms", "inf"],
     "--layer-forward-ms must be a number from 0 to 1e+09, got inf"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--layer-bytes", "2000000000000000"],
     "--layer-bytes must be from 1 to 2**50"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--resize", "fc.weight=١"],
     "--resize 'fc.weight=١': expected NAME=BYTES"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--iterations", "1000000"],
     "--iterations must be from 1 to 1000"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--seed", "-1"], "--seed must be from 0 to"),
    (["trace", "--model", "mlp", "-o", "t.jsonl", "--batch-size", "0"], "--batch-size must be"),
    # gradwire profile
    (["profile", "--model", "mlp", "--batch-size", "0"], "must be from 1 to 65536, got 0"),
    (["profile", "--model", "mlp", "--batch-size", "-1"], "must be from 1 to 65536, got -1"),
    (["profile", "--model", "mlpp"], "did you mean 'mlp'"),
]


@pytest.mark.parametrize("args,msg", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_bad_cli_input_is_one_line_exit_2_and_builds_nothing(monkeypatch, capsys, builds, args,
                                                             msg):
    code, err = cli_error(monkeypatch, capsys, *args)
    assert code == 2, err
    assert msg in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert builds == []


def test_collectives_without_a_process_group_say_so():
    assert not dist.is_initialized()  # runs before the fixture below makes one
    with pytest.raises(GradwireError, match="torch.distributed is not initialized"):
        gc.all_reduce(torch.ones(4))


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """A world of one rank in this process (what the API calls below validate against)."""
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


x8, x3 = torch.ones(8), torch.tensor([1.0, 2.0, 3.0])
r8, r16 = torch.zeros(8), torch.zeros(16)
API = [
    (lambda: gc.all_reduce(torch.ones(3, dtype=torch.bool)), "has dtype torch.bool"),
    (lambda: gc.all_reduce([1.0, 2.0]), "tensor must be a torch.Tensor, got list"),
    (lambda: gc.all_reduce(torch.ones(4, 4).t()), "must be contiguous"),
    (lambda: gc.all_reduce(x8, op="band"), "reduction op 'band' is not supported"),
    (lambda: gc.all_reduce(x8, algo="rnig"), "did you mean 'ring'"),
    (lambda: gc.broadcast(x8, src=5), "root must be a rank in 0..0, got 5"),
    (lambda: gc.broadcast(x8, src="0"), "root must be a rank in 0..0, got '0'"),
    (lambda: gc.reduce(x8, dst=None), "root must be a rank in 0..0, got None"),
    (lambda: gc.all_gather_into_tensor(torch.ones(3), x8), "output must have world_size"),
    (lambda: gc.reduce_scatter_tensor(x8, torch.ones(3)), "input must have world_size"),
    (lambda: sparse_allreduce(x8, torch.zeros(8), 0), "k must be an integer >= 1"),
    (lambda: sparse_allreduce(x8, torch.zeros(8), 2.5), "k must be an integer >= 1"),
    (lambda: sparse_allreduce(x8, torch.zeros(8), 2, "gtop"), "method must be one of"),
    (lambda: sparse_allreduce(x8, torch.zeros(8), 2, selector="fast"), "selector must be"),
    (lambda: sparse_allreduce(torch.ones(2, 4), torch.zeros(2, 4), 2), "x must be a 1-D"),
    (lambda: sparse_allreduce(x8, torch.zeros(9), 2), "residual must match x"),
    (lambda: sparse_allreduce(x8, x8, 2), "residual must be a tensor of its own"),
    (lambda: topk_allreduce(x3, torch.tensor([0, 5, -1]), 10), "indices must lie in [0, 10)"),
    (lambda: topk_allreduce(x3, torch.tensor([0, 5, 10]), 10), "got 0..10"),
    (lambda: topk_allreduce(x3, torch.tensor([0, 5]), 10), "indices must be an integer tensor"),
    (lambda: topk_allreduce(x3, torch.tensor([0.0, 1, 2]), 10), "indices must be an integer"),
    (lambda: topk_allreduce(x3, torch.tensor([0, 1, 2]), "10"), "numel must be an integer"),
    (lambda: topk_allreduce(torch.tensor([1, 2]), torch.tensor([0, 1]), 10), "values must be"),
    (lambda: gtopk_allreduce(x3, torch.tensor([0, 1, 2]), 10, torch.zeros(9)),
     "residual must be (10,) torch.float32"),
    (lambda: gtopk_allreduce(x3, torch.tensor([0, 1, 2]), 10, torch.zeros(1).expand(10)),
     "residual is written in place"),
    (lambda: gtopk_allreduce(x3, torch.tensor([0, 1, 2]), 10, torch.zeros(10, device="meta")),
     "residual must be (10,) torch.float32 on cpu, got (10,) torch.float32 on meta"),
    (lambda: sparse_allreduce(x8, r8, 2, out=r8), "out may be x, never the residual"),
    (lambda: sparse_allreduce(torch.ones(8, device="meta"), torch.zeros(8, device="meta"), 2),
     "gloo sends cpu tensors, got one on meta"),  # was: "residual ... shares its memory"
    (lambda: sparse_allreduce(x8, r16[:8], 2, out=r16[4:12]), "residual must be a tensor of"),
    (lambda: sparse_allreduce(x8, torch.zeros(8), 2, algo="ring"), "gtopk runs on the butterfly"),
    (lambda: gh.make("topkk"), "did you mean 'topk'"),
    (lambda: gh.make("topk", density=0), "density"),
    (lambda: gh.make("topk", density=1.5), "density"),
    (lambda: gh.make("topk", mode="layer"), "mode must be one of"),
    (lambda: Transport(timeout=0), "timeout must be a number of seconds from 0.001"),
    (lambda: Transport(timeout=math.nan), "timeout must be a number of seconds from 0.001"),
    (lambda: Transport(timeout=math.inf), "seconds from 0.001 to 2e+06, got inf"),
    (lambda: Transport(timeout=1e15), "timeout must be a number of seconds from 0.001 to"),
    (lambda: Transport(timeout=True), "got True"),
    (lambda: parse_bandwidth("-1gbit"), "bandwidth '-1gbit' is not valid"),
    (lambda: get_compressor("tpok"), "did you mean 'topk'"),
    (lambda: get_compressor("topk", density=0), "density"),
    (lambda: get_compressor("qsgd", s=2**24 + 1), "qsgd: s must be at most 16777216"),
    (lambda: get_compressor("dgc", slack=math.nan), "dgc: slack must be a finite number >= 1"),
    (lambda: gh.make("dgc", slack=math.inf), "dgc: slack must be a finite number >= 1"),
    (lambda: gc.all_reduce(x8, algo="ring", pipeline={}), "parameter pipeline={}: expected"),
    (lambda: registry.get("allreduce", "rign"), "did you mean 'ring'"),
    (lambda: registry.get("alreduce"), "unknown collective 'alreduce'"),
    (lambda: loopback_cluster(0), "--hosts must be between 1 and 250, got 0"),
    (lambda: measure("mlp", batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (lambda: SimCluster(2, math.inf), "bandwidth must be a finite rate > 0"),  # it hung
    (lambda: SimCluster(2, 1e9, send_buffer=math.nan), "send_buffer must be a finite number"),
    (lambda: SimCluster(2, 1e9, latency=-1e-6), "latency must be a finite number of seconds"),
    (lambda: SimCluster(2, 1e9, alpha=math.nan), "alpha must be a finite number of seconds"),
    (lambda: SimCluster(2.5, 1e9), "whole numbers >= 1, got 2.5"),
    (lambda: SimCluster(10**5, 1e9), "workers must be at most 4096"),  # it ran for hours
    (lambda: registry.schedule("allreduce", "ring", 10**5, 8), "world size must be from 1 to"),
    (lambda: SimCluster(2, 1e9, seed=-1), "seed must be a whole number >= 0"),
    (lambda: measure("mlp", warmup=-1), "profile: warmup must be from 0 to 1000, got -1"),
    (lambda: gc.all_reduce(x8, algo="ring", blok=5),
     "allreduce ring has no parameter 'blok': it takes pipeline"),
    (lambda: gc.broadcast(x8, algo="lp", blok=5), "did you mean 'block'"),
    (lambda: gc.all_reduce(x8, algo="rhd", pipeline=2), "it takes none"),
    (lambda: gc.all_reduce(x8, async_op="yes"), "async_op must be True or False, got 'yes'"),
]


@pytest.mark.parametrize("call,msg", API, ids=[m for _, m in API])
def test_bad_api_input_is_one_gradwire_error(one_rank, call, msg):
    with pytest.raises(GradwireError) as e:
        call()
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_unreadable_files_say_where(monkeypatch, tmp_path):
    """Calibration JSON with the line and column, or the missing field; a checkpoint that is
    not one (torch.load with weights_only=True, so never unpickled code)."""
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    path = calibrate.calibration_path("1gbit")
    path.parent.mkdir(parents=True)
    path.write_text('{"alpha_s": 1e-4,\n "beta_s_per_byte": }\n')
    with pytest.raises(GradwireError, match=r"calibration file .*line 2, column 21: not valid"):
        calibrate.load("1gbit")
    path.write_text('{"alpha_s": 1e-4, "beta_s_per_byte": 8e-9}\n')
    with pytest.raises(GradwireError, match="older gradwire calibrate .* run `gradwire "
                                            "calibrate` again"):
        calibrate.load("1gbit")
    path.write_text('{"format": 2, "alpha_s": 1e-4}\n')
    with pytest.raises(GradwireError, match="field 'alpha_call_s' is missing"):
        calibrate.load("1gbit")
    bad = tmp_path / "ck.pt"
    bad.write_bytes(b"PK\x03\x04 not a checkpoint")
    with pytest.raises(GradwireError, match="is not a gradwire checkpoint"):
        checkpoint.load(bad)


def test_a_tampered_cluster_state_file_is_refused(monkeypatch, tmp_path):
    """Names from /run/gradwire go to `ip netns exec`: one that is not gradwire's (here an
    option, "-all") must not get there."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    host = {"rank": 0, "netns": "-all", "addr": "10.213.1.1", "ifname": "eth0"}
    (tmp_path / "gw00aa11.json").write_text(json.dumps(
        {"name": "gw00aa11", "bandwidth_bps": 1e9, "hosts": [host], "subnet": 1}))
    with pytest.raises(GradwireError, match="unreadable .*names gradwire does not make"):
        load_cluster("gw00aa11")
    assert list_clusters() == []
    # and its name is not taken for good: `cluster down` removes the file it cannot read
    from gradwire.cluster import cluster_down

    assert cluster_down("gw00aa11") == ["gw00aa11"]
    assert not (tmp_path / "gw00aa11.json").exists()


def test_calibrate_refuses_a_home_it_cannot_write_before_measuring(monkeypatch, capsys,
                                                                    builds):
    monkeypatch.setenv("GRADWIRE_HOME", "/etc/passwd")
    code, err = cli_error(monkeypatch, capsys, "calibrate", "--hosts", "2")
    assert code == 2 and "cannot save calibrations in '/etc/passwd/calibration'" in err, err
    assert len(err.strip().splitlines()) == 1 and builds == []


def test_environment_overrides_are_checked(monkeypatch, one_rank):
    monkeypatch.setenv("GRADWIRE_TIMEOUT", "soon")
    with pytest.raises(GradwireError, match="GRADWIRE_TIMEOUT must be a number of seconds"):
        Transport()
    monkeypatch.setenv("GRADWIRE_TIMEOUT", "inf")
    with pytest.raises(GradwireError, match="GRADWIRE_TIMEOUT must be a number of seconds"):
        Transport()
    monkeypatch.delenv("GRADWIRE_TIMEOUT")
    monkeypatch.setenv("GRADWIRE_CHECK_CALLS", "maybe")
    with pytest.raises(GradwireError, match="GRADWIRE_CHECK_CALLS must be 1/true/yes/on or"):
        Transport()
    for word, on in (("OFF", False), ("0", False), ("no", False), ("", True), ("Yes", True),
                     ("1", True)):
        monkeypatch.setenv("GRADWIRE_CHECK_CALLS", word)
        assert Transport().check_calls is on


@pytest.mark.parametrize("axis,text,msg", [
    ("workers", "abc", "expected whole numbers >= 1"), ("workers", "2.5", "whole numbers >= 1"),
    ("workers", "0", "whole numbers >= 1"), ("layers", "-1", "whole numbers >= 0"),
    ("workers", "٨", "whole numbers >= 1"), ("workers", "4097", "(up to 4096)"),
    ("layers", "100001", "(up to 100000)"), ("speedup", "inf", "numbers > 0"),
    ("speedup", "0", "numbers > 0"), ("speedup", "nan", "numbers > 0"),
    ("bandwidth", "none", "is not valid: expected a rate like 100mbit, 1gbit, 2.5gbit, 10gbit, "
     r"25gbit \(units kbit, mbit, gbit, tbit\)$"), ("bandwidth", "fast", "is not valid")])
def test_bad_sweep_values_are_one_line(axis, text, msg):
    from gradwire.sim.simulate import sweep_value as _sweep_value

    with pytest.raises(GradwireError, match=msg):
        _sweep_value(axis, text)
    assert _sweep_value("workers", "8") == 8 and _sweep_value("layers", "0") == 0
    assert _sweep_value("bandwidth", "1gbit") == 1e9 and _sweep_value("speedup", "0.5") == 0.5


def test_binary_or_deeply_nested_files_are_one_line(tmp_path):
    from gradwire import profiles
    from gradwire.sim import trace

    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00abc")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(GradwireError, match="not a text file"):
        trace.load(tmp_path / "bin.jsonl")
    with pytest.raises(GradwireError, match="nested too deep"):
        trace.load(tmp_path / "deep.json")
    with pytest.raises(GradwireError, match="nested too deep"):
        profiles.load(str(tmp_path / "deep.json"))


def test_output_paths_are_checked_before_the_work(tmp_path):
    from gradwire.jsonfile import check_writable

    for path, msg in (("/dev/full", "is not a regular file"), ("/dev/null", "not a regular"),
                      ("/proc/version", "is in /proc"), ("/proc/self/gw.json", "is in /proc"),
                      ("/sys/kernel/gw.json", "is in /sys")):
        with pytest.raises(GradwireError, match=msg):
            check_writable(path, "--json")
    (tmp_path / "file").write_text("x")
    assert check_writable(None, "--json") is None
    assert check_writable(tmp_path / "new.json", "--json") == tmp_path / "new.json"
    assert check_writable(tmp_path / "file", "--json") == tmp_path / "file"  # overwritten
    with pytest.raises(GradwireError, match="is a directory"):
        check_writable(tmp_path, "--json")
    with pytest.raises(GradwireError, match="is not a folder"):
        check_writable(tmp_path / "file" / "x.json", "--json")
    with pytest.raises(GradwireError, match="does not exist"):
        check_writable(tmp_path / "no" / "x.json", "--plot")
    assert not (tmp_path / "new.json").exists()  # checking writes nothing


def test_an_existing_output_file_needs_a_folder_that_may_be_written(monkeypatch, tmp_path):
    """The result is written beside the file and renamed over it, so the folder must take a
    new file; the check had looked only at the file, and the write failed after the work.
    (Root may write any folder, so the folder's refusal is simulated.)"""
    from gradwire import jsonfile

    (tmp_path / "old.json").write_text("{}")
    real = os.access
    monkeypatch.setattr(jsonfile.os, "access",
                        lambda p, mode: Path(p) != tmp_path and real(p, mode))
    with pytest.raises(GradwireError, match=r"^--json '.*old\.json': folder '.*' may not be "
                                            r"written$"):
        jsonfile.check_writable(tmp_path / "old.json", "--json")


def test_a_write_that_fails_late_saves_the_result_elsewhere(monkeypatch, tmp_path, capsys):
    """The check before the work cannot see a disk fill up: the result then goes to a new file
    (here in the current folder) and one line names both."""
    from gradwire.cli.options import write_json

    monkeypatch.chdir(tmp_path)
    with pytest.raises(GradwireError) as e:
        write_json(__import__("pathlib").Path("/dev/full"), {"rows": [1, 2]})
    msg = str(e.value)
    assert msg.startswith("could not write /dev/full (No space left on device); result saved to ")
    saved = msg.rsplit(" ", 1)[1]
    assert saved.startswith(str(tmp_path / "gradwire-full-")) and "\n" not in msg
    assert json.loads(open(saved).read()) == {"rows": [1, 2]}
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # the device is left as it was


def test_a_write_that_fails_leaves_the_file_that_was_there(monkeypatch, tmp_path):
    """A result written over an earlier one and failing half way (a full disk) leaves the
    earlier one whole, and no half-written file beside it."""
    import errno

    from gradwire.cli import options

    old = tmp_path / "r.json"
    old.write_text("the earlier result\n")
    monkeypatch.chdir(tmp_path)

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(options.os, "replace", full)
    with pytest.raises(GradwireError, match="could not write .*r.json"):
        options.write_json(old, {"rows": [1]})
    assert old.read_text() == "the earlier result\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("name", ["curves.png", "curves.svg"])
def test_a_figure_that_fails_half_way_leaves_the_one_that_was_there(monkeypatch, tmp_path,
                                                                     name):
    """Figures (train, demo, whatif, simulate --plot) are replaced whole as results are: drawn
    beside the file in the format its extension names, so a write that fails half way leaves
    the earlier figure, and nothing beside it."""
    import errno

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from gradwire.jsonfile import save_figure

    path = tmp_path / name
    fig = plt.figure()
    fig.gca().plot([1, 2])
    save_figure(fig, path, dpi=50)
    first = path.read_bytes()
    assert first.startswith(b"\x89PNG") if name.endswith(".png") else b"<svg" in first

    def half(self, fname, **kwargs):
        __import__("pathlib").Path(fname).write_bytes(b"half a figure")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", half)
    with pytest.raises(OSError, match="No space left"):
        save_figure(plt.figure(), path, dpi=50)
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == [name]


@given(st.recursive(st.floats() | st.integers() | st.text() | st.none(),
                     lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids),
                     max_leaves=20))
def test_result_files_are_strict_json(doc):
    """A diverged loss (NaN) or an infinite time is written as null, never as the NaN or
    Infinity that strict JSON readers refuse; every finite value is kept as it was."""
    from gradwire.cli.options import write_json

    with tempfile.TemporaryDirectory() as d:
        path = __import__("pathlib").Path(d) / "r.json"
        write_json(path, doc)
        text = path.read_text()
    back = strict_json(text)

    def same(a, b):
        if isinstance(a, float) and not math.isfinite(a):
            return b is None
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(map(same, a, b))
        return a == b

    assert same(doc, back)


def test_simulate_says_where_its_result_went_when_its_folder_went(monkeypatch, capsys,
                                                                   tmp_path):
    """A folder removed during a run: exit 2, one line, and the result in a file it names."""
    from gradwire.sim import simulate
    from gradwire.sim.trace import save, synthetic

    trace = save(synthetic("tiny", [1000, 2000], 0.01, 0.02), tmp_path / "t.jsonl")
    out = tmp_path / "gone" / "r.json"
    out.parent.mkdir()

    def run(sim, console):
        out.parent.rmdir()  # after the check of --json, before the write
        return {"results": ["done"]}

    monkeypatch.setattr(simulate, "run_simulation", run)
    monkeypatch.chdir(tmp_path)
    code, err = cli_error(monkeypatch, capsys, "simulate", "--trace", str(trace), "--json",
                          str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"could not write {out} (No such file or directory); result saved to " in err, err
    saved = err.strip().rsplit(" ", 1)[1]
    assert json.loads(open(saved).read())["results"] == ["done"]


@pytest.mark.parametrize("field,value,msg", [
    ("bytes", 10**30, "field 'bytes': expected an integer from 1 to 1125899906842624 (2**50), "
                      "got 1000000000000000000000000000000"),
    ("bytes", 2**50 + 1, "field 'bytes': expected an integer from 1 to"),
    ("bytes", 2**49, "field 'bytes': the parameters come to 1125899906843624 bytes, more than "
                     "the 2**50 a trace may hold"),
    ("forward_s", 1e300, "field 'forward_s': expected seconds from 0 to 1e+06, got 1e+300"),
    ("backward", [float("inf"), 0.0], "field 'backward[0]': expected seconds from 0 to 1e+06"),
])
def test_trace_fields_out_of_range_are_one_line(monkeypatch, capsys, tmp_path, field, value,
                                                msg):
    """A trace's numbers within the simulator's range (10**30 bytes was an OverflowError)."""
    from gradwire.sim.trace import dumps, synthetic

    lines = dumps(synthetic("tiny", [1000, 2000], 0.01, 0.02)).splitlines()
    row = 2 if field == "bytes" else 3  # the second parameter; the iteration
    rec = json.loads(lines[row])
    if value == 2**49:  # two parameters of 2**49 bytes and the first's 1000 go over 2**50
        lines[1] = lines[1].replace('"bytes": 1000', f'"bytes": {2**49 + 1000}')
    rec[field] = value
    lines[row] = json.dumps(rec)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, err = cli_error(monkeypatch, capsys, "simulate", "--trace", str(path), "--workers", "2")
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_bench_sizes_must_fit_the_machine(monkeypatch):
    """3 × ranks × size against the memory the ranks would share (64G at 4 ranks is 768 GiB)."""
    from gradwire.bench import spec

    monkeypatch.setattr(spec, "available_memory", lambda device: (16 * 2**30, "available"))
    with pytest.raises(GradwireError, match=r"--sizes: 64G is too large for 4 ranks on this "
                       r"machine: they would hold about 768 GiB in float32, and it has 16 GiB of "
                       r"available memory: expected sizes up to 1365M"):
        spec.check_sizes([2**10, 64 * 2**30], "float32", 4, "cpu")
    spec.check_sizes([4, 2**30], "float32", 4, "cpu")
    with pytest.raises(GradwireError, match="4 bytes hold no float64 element"):
        spec.check_sizes([4], "float64", 4, "cpu")
    # a 1-byte dtype's check weights are as large as its buffer: 4 × ranks × size
    spec.check_sizes([4, 1200 * 2**20], "float32", 4, "cpu")
    with pytest.raises(GradwireError, match=r"1200M is too large for 4 ranks on this machine: "
                       r"they would hold about 18.8 GiB in int8, .* expected sizes up to 1G"):
        spec.check_sizes([4, 1200 * 2**20], "int8", 4, "cpu")


def test_typed_numbers_are_ascii():
    """Python's int() and float() take other scripts' digits, underscores, nan and inf."""
    from gradwire.check import parse_int, parse_number
    from gradwire.sizes import parse_sizes

    assert registry.parse_params(["a=4", "b=1e-5", "c=١", "d=nan", "e=1_0", "f=inf"]) == {
        "a": 4, "b": 1e-5, "c": "١", "d": "nan", "e": "1_0", "f": "inf"}
    assert [parse_int(t) for t in ("12", "-3", "١٢", "1_2", "0x1", "")] == [12, -3] + [None] * 4
    assert [parse_number(t) for t in ("2.5", ".5", "1e3", "٢", "nan", "inf", "1,5")] == [
        2.5, 0.5, 1000.0, None, None, None, None]
    for bad in ("١gbit", "1\u212abit", "１gbit"):  # Arabic-Indic one, Kelvin sign, fullwidth one
        with pytest.raises(GradwireError, match="is not valid"):
            parse_bandwidth(bad)
    for bad in ("١K", "1\u212a", "1K:8K:٢"):
        with pytest.raises(GradwireError, match="is not valid"):
            parse_sizes(bad)


def test_an_error_that_holds_a_line_break_is_still_one_line(monkeypatch, capsys):
    import sys

    from gradwire import cli

    monkeypatch.setattr(sys, "argv", ["gradwire", "simulate", "--trace", "no\nsuch.jsonl"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-3, 3))
def test_every_command_checks_density_one_way(density):
    """One check for every command's --density: (0, 1] passes as a float; anything else is
    one line that echoes the number as typed (2, not 2.0)."""
    from gradwire.check import check_density

    if isinstance(density, float) and 0 < density <= 1 or density == 1:
        assert check_density(density) == float(density)
        return
    with pytest.raises(GradwireError) as e:
        check_density(density)
    assert str(e.value) == f"--density must be in (0, 1], got {density:g}"


def test_bench_checks_the_widest_dtype_of_a_list_first_and_names_the_one_too_large(
        monkeypatch, capsys):
    """--dtype all --sizes 1:4K was refused for float32 (4 bytes), then at 4:4K for float64;
    a memory refusal of a list did not say which dtype's buffers were too large."""
    from conftest import cli_error, one_line_cli_error

    from gradwire.bench import spec

    code, err = cli_error(monkeypatch, capsys, "bench", "--dtype", "all", "--sizes", "1:4K")
    one_line_cli_error(code, err, "--sizes: 1 bytes hold no float64 element: expected sizes "
                       "of at least 8 bytes")
    monkeypatch.setattr(spec, "available_memory", lambda device: (16 * 2**30, "available"))
    spec.check_sizes([4, 1200 * 2**20], "float32", 4, "cpu")
    with pytest.raises(GradwireError, match=r"18.8 GiB in int8, and it has 16 GiB"):
        spec.check_sizes([4, 1200 * 2**20], "int8", 4, "cpu")
