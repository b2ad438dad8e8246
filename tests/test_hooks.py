"""gradwire.hooks: the factory's checks, the warm-up schedule, residuals carried across DDP's
bucket rebuild, payload packing, the comm thread, checkpoints; then every method under DDP on
gloo with P = 2 and 3 (tests/scripts/hooks_check.py), under Lightning and under torchrun."""
import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch
from conftest import SCRIPTS, run_checks
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh
from gradwire.compress import get as get_compressor
from gradwire.errors import GradwireError
from gradwire.hooks import comm, layout
from gradwire.hooks.warmup import parse

ALL = ("dense", "fp16", "bf16", "topk", "gtopk", "randomk", "dgc", "signsgd", "efsignsgd",
       "qsgd", "terngrad", "int8", "powersgd")


def test_methods_are_the_listed_thirteen():
    assert set(gh.METHODS) == set(ALL)
    for m in ALL:
        assert gh.make(m).config.method.name == m


# --- bad input: one line that names what is allowed -------------------------------------------

@pytest.mark.parametrize("kwargs, says", [
    ({"method": "topkk"}, "did you mean 'topk'"),
    ({"method": "nope"}, "expected one of dense, fp16"),
    ({"method": "topk", "density": 0}, "density must be in (0, 1]"),
    ({"method": "topk", "density": 1.5}, "density must be in (0, 1]"),
    ({"method": "topk", "mode": "layer"}, "mode must be one of bucket, model"),
    ({"method": "topk", "warmup": "yes"}, "warmup must be None, True, False or a list"),
    ({"method": "topk", "warmup": [0.5, 2]}, "warmup density must be in (0, 1]"),
    ({"method": "topk", "dense_steps": -1}, "dense_steps must be an integer >= 0"),
    ({"method": "topk", "seed": -1}, "seed must be an integer >= 0"),
    ({"method": "topk", "overlap": "yes"}, "overlap must be True or False"),
    ({"method": "dense", "algo": "rign"}, "unknown allreduce algorithm 'rign'"),
    ({"method": "topk", "rank": 2}, "topk: unknown option 'rank': topk's own: selector; "
     "make's: density, mode,"),
    ({"method": "fp16", "s": 3}, "fp16: unknown option 's': fp16's own: none; make's:"),
    # a misspelt keyword of make's own is an unknown option of the method's: named as such
    ({"method": "gtopk", "densty": 0.1}, "gtopk: unknown option 'densty' (did you mean "
     "'density'?): gtopk's own: selector; make's: density,"),
    ({"method": "topk", "selector": "fast"}, "selector must be 'threshold' or 'exact'"),
    ({"method": "qsgd", "s": 0}, "s must be an integer >= 1"),
    ({"method": "powersgd", "rank": 0}, "rank must be an integer >= 1"),
    ({"method": "topk", "momentum": 1.0}, "momentum must be a number in [0, 1)"),
    ({"method": "topk", "momentum": "0.9"}, "momentum must be a number in [0, 1)"),
    ({"method": "fp16", "momentum": 0.9}, "fp16 keeps none: give the optimizer the momentum"),
])
def test_bad_input_is_one_line_naming_what_is_allowed(kwargs, says):
    with pytest.raises(GradwireError) as e:
        gh.make(**kwargs)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_options_reach_the_compressor():
    assert gh.make("qsgd", s=7).compressor.s == 7
    assert gh.make("powersgd", rank=2).compressor.power.rank == 2
    assert gh.make("gtopk", selector="exact").compressor.selector == "exact"
    assert gh.make("dgc", density=0.01, slack=2).compressor.slack == 2.0


def test_hook_passes_ddps_signature_check():
    DDP._check_comm_hook(None, gh.make("dense").hook)  # raises on a wrong signature


# --- warm-up ------------------------------------------------------------------------------

def test_the_density_asked_for_is_used_from_the_first_step():
    s = gh.make("gtopk", density=0.001)
    assert s.density == 0.001 and s.config.warmup.densities == ()
    s.step = 10**6  # nothing moves it: no epochs to count
    assert s.density == 0.001


def test_the_papers_warmup_is_counted_by_the_hook_in_steps():
    s = gh.make("gtopk", density=0.001, warmup=True, steps_per_epoch=3)
    got = []
    for step in range(18):
        s.step = step
        got.append(s.density)
    assert got == [0.25] * 3 + [0.0725] * 3 + [0.015] * 3 + [0.004] * 3 + [0.001] * 6
    s.step = 4
    s.set_epoch(3)  # moves the count: epoch 3 from step 4, epoch 4 from step 7
    assert s.epoch == 3 and s.density == 0.004
    s.step = 7
    assert s.epoch == 4 and s.density == 0.001


def test_a_warmup_resumed_half_way_through_an_epoch_ends_it_on_time():
    """Saved at step 5 of epochs of 4 steps (epoch 1 began at step 4): the resumed hook's
    epoch 2 begins at step 8, as it would have without the stop."""
    def densities(s, steps):
        out = []
        for step in steps:
            s.step = step
            out.append(s.density)
        return out

    make = lambda: gh.make("topk", density=0.001, warmup=True, steps_per_epoch=4)  # noqa: E731
    whole = densities(make(), range(12))
    first = make()
    densities(first, range(6))
    first.step = 5
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert densities(resumed, range(5, 12)) == whole[5:]
    for bad in ({"step": -1}, {"epoch_at": [1, 9]}, {"epoch_at": [-1, 4]}):
        with pytest.raises(GradwireError, match="expected counts >= 0"):
            make().load_state_dict({**first.state_dict(), **bad})


def test_a_warmup_needs_steps_per_epoch():
    with pytest.raises(GradwireError, match="a warm-up needs steps_per_epoch=N"):
        gh.make("gtopk", warmup=True)
    with pytest.raises(GradwireError, match="steps_per_epoch must be an integer >= 1"):
        gh.make("gtopk", warmup=[0.1], steps_per_epoch=0)


def test_warmup_never_goes_below_target_and_can_be_off_or_custom():
    assert parse(True, 0, 5).density(0, 0.01) == 0.25
    assert parse(True, 0, 5).density(3, 0.01) == 0.01  # 0.004 < target
    assert parse(None, 0).density(0, 0.01) == 0.01
    assert parse(False, 0).density(0, 0.01) == 0.01
    assert parse([0.5], 0, 5).density(0, 0.01) == 0.5
    assert parse([0.5], 0, 5).density(1, 0.01) == 0.01


def test_dense_steps_then_compression_and_non_sparse_methods_ignore_densities():
    s = gh.make("topk", density=0.01, warmup=False, dense_steps=2)
    assert s.density == 1.0 and s.config.warmup.dense(0) and s.config.warmup.dense(1)
    s.step = 2
    assert s.density == 0.01
    assert gh.make("qsgd").density == 1.0


# --- residuals across a bucket rebuild ------------------------------------------------------

def test_carry_moves_each_parameters_residual_to_the_new_layout():
    numels = {0: 2, 1: 3, 2: 1}
    res = {(0, 1, 2): torch.arange(6, dtype=torch.float64)}  # p0: 0 1, p1: 2 3 4, p2: 5
    like = torch.zeros(1, dtype=torch.float64)
    layout.carry(res, (2, 0), numels, like)
    assert res[(2, 0)].tolist() == [5, 0, 1]
    assert (0, 1, 2) in res  # still holds p1
    layout.carry(res, (1,), numels, like)
    assert res[(1,)].tolist() == [2, 3, 4] and (0, 1, 2) not in res
    split = layout.split(res, numels)
    assert {k: v.tolist() for k, v in split.items()} == {0: [0, 1], 1: [2, 3, 4], 2: [5]}


def test_carry_leaves_new_parameters_without_residual_alone():
    res: dict = {}
    layout.carry(res, (0,), {0: 4}, torch.zeros(1))
    assert res == {}
    res = {(0,): torch.ones(2)}
    layout.carry(res, (1, 0), {0: 2, 1: 3}, torch.zeros(1))
    assert res[(1, 0)].tolist() == [0, 0, 0, 1, 1]


def test_carry_moves_a_loaded_residual_to_the_buckets_device():
    """A state loaded onto the CPU (map_location="cpu") and a bucket on another device: a
    one-parameter layout, used as it is, goes there too (the meta device stands in for a GPU)."""
    res = {(0,): torch.ones(3)}
    layout.carry(res, (0,), {0: 3}, torch.empty(3, device="meta"))
    assert res[(0,)].device.type == "meta" and res[(0,)].shape == (3,)


def test_positions_are_first_seen_order_and_check_sizes():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    pos = layout.Positions()
    assert pos.layout([b, a]) == (0, 1) and pos.layout([a]) == (1,)
    assert pos.position(a) == 1 and pos.size((0, 1)) == 5
    pos.numels[2] = 7  # from a state_dict of another model
    with pytest.raises(GradwireError, match="has 4 elements"):
        pos.layout([torch.nn.Parameter(torch.zeros(4))])


# --- checkpoints --------------------------------------------------------------------------

def _powersgd_state():
    """A PowerSGD hook part-way through training: epoch 3, step 17, residuals and memory."""
    s = gh.make("powersgd", rank=1)
    s.set_epoch(3)
    s.step = 17
    s.positions.numels.update({0: 2, 1: 3})
    s.ef.residuals[(1, 0)] = torch.tensor([1.0, 2, 3, 4, 5])
    s.compressor.power.memory[(1, 0)] = torch.ones(3, 1)
    s.compressor.power.step = 9
    return s


def test_state_dict_round_trip_and_method_check():
    s = _powersgd_state()
    saved = s.state_dict()
    assert {k: v.tolist() for k, v in saved["residuals"].items()} == {1: [1, 2, 3], 0: [4, 5]}
    t = gh.make("powersgd", rank=1)
    t.load_state_dict(saved)
    assert (t.epoch, t.step, t.compressor.power.step) == (3, 17, 9)
    assert torch.equal(t.compressor.power.memory[(1, 0)], torch.ones(3, 1))
    assert t.state_dict()["residuals"].keys() == {0, 1}
    with pytest.raises(GradwireError, match="for method 'powersgd', this hook runs 'topk'"):
        gh.make("topk").load_state_dict(saved)


@pytest.mark.parametrize("change,msg", [
    ({"step": 99, "order": "xyz"}, "malformed"),
    ({"step": 99, "residuals": {0: torch.zeros(7)}}, "residual of parameter 0 has 7 elements"),
    ({"step": 99, "compressor": None}, "malformed"),
    ({"step": 99, "compressor": {"step": 1}}, "malformed"),  # PowerSGD's memory is missing
    ({"epoch": "late", "epoch_at": None}, "malformed"),  # as saved before epoch_at was kept
    ({"epoch_at": "late"}, "malformed"),
    ({"step": 2.7}, "malformed.*step, epoch and epoch_at hold integers"),
    ({"step": True}, "malformed"),
])
def test_a_refused_state_dict_changes_nothing(change, msg):
    s = _powersgd_state()
    before = s.state_dict()
    with pytest.raises(GradwireError, match=msg):
        s.load_state_dict({**before, **change})
    for bad in (None, [], {"method": "powersgd"}):
        with pytest.raises(GradwireError):
            s.load_state_dict(bad)
    after = s.state_dict()
    assert (after["epoch"], after["step"], s.positions.numels) == (3, 17, {0: 2, 1: 3})
    assert {k: v.tolist() for k, v in after["residuals"].items()} == {1: [1, 2, 3], 0: [4, 5]}
    assert after["compressor"]["step"] == 9
    assert torch.equal(s.compressor.power.memory[(1, 0)], torch.ones(3, 1))


def test_velocities_are_checkpointed_per_parameter_and_checked():
    s = gh.make("gtopk", momentum=0.9)
    s.positions.numels.update({0: 2, 1: 3})
    s.velocities[(1, 0)] = torch.tensor([1.0, 2, 3, 4, 5])
    saved = s.state_dict()
    assert {k: v.tolist() for k, v in saved["velocities"].items()} == {1: [1, 2, 3], 0: [4, 5]}
    t = gh.make("gtopk", momentum=0.9)
    t.load_state_dict(saved)
    assert {k: v.tolist() for k, v in t.velocities.items()} == {(1,): [1, 2, 3], (0,): [4, 5]}
    with pytest.raises(GradwireError, match="velocity of parameter 0 has 7 elements"):
        t.load_state_dict({**saved, "velocities": {0: torch.zeros(7)}})
    assert t.velocities.keys() == {(0,), (1,)}  # refused: nothing changed
    old = {k: v for k, v in saved.items() if k != "velocities"}  # saved without momentum
    t.load_state_dict(old)
    assert t.velocities == {}


# --- payload bytes and the comm thread ------------------------------------------------------

@pytest.mark.parametrize("name", ["topk", "dgc", "efsignsgd", "qsgd", "terngrad", "signsgd",
                                  "randomk"])
def test_payload_survives_packing(name):
    c = get_compressor(name)
    x = torch.randn(1001, generator=torch.Generator().manual_seed(1))
    payload = c.compress(x)
    raw = comm.pack(payload)
    assert raw.numel() == payload.nbytes == c.wire_bytes(x.numel(), x.dtype)
    odd = torch.cat([torch.zeros(3, dtype=torch.uint8), raw])[3:]  # at an unaligned offset
    assert torch.equal(c.decompress(comm.unpack(payload, odd), 1001),
                       c.decompress(payload, 1001))


def test_worker_runs_in_order_and_hands_errors_to_the_futures():
    w = comm.Worker()
    order: list[int] = []
    futs = [torch.futures.Future() for _ in range(5)]
    for i, f in enumerate(futs):
        w.submit(lambda i=i: order.append(i) or [torch.tensor(i)], [f])

    def boom() -> list[torch.Tensor]:
        raise GradwireError("broken")

    bad = [torch.futures.Future(), torch.futures.Future()]
    w.submit(boom, bad)
    assert [int(f.wait()) for f in futs] == [0, 1, 2, 3, 4] and order == [0, 1, 2, 3, 4]
    for f in bad:
        with pytest.raises(Exception, match="broken"):
            f.wait()
    thread = w._thread
    del w
    thread.join(timeout=5)
    assert not thread.is_alive() and threading.current_thread() is not thread


# --- under DDP ----------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 3])
def test_every_method_under_ddp(p):
    run_checks("hooks_check.py", p, timeout=300)


def test_the_hot_path_is_sync_free():
    """tests/scripts/syncfree_check.py: on the device path (run on CPU tensors), a steady-state
    backward makes no host-device synchronisation (dense, fp16) or exactly the one documented
    read per step (topk, gtopk, powersgd), and gives the host path's gradients bit for bit."""
    run_checks("syncfree_check.py", 3, timeout=300)


# --- launchers and frameworks -------------------------------------------------------------

def test_lightning_strategy_runs_the_hook_on_cpu():
    # Lightning's own ddp_comm_hook argument is ignored off CUDA; gradwire's strategy is not.
    run_checks("lightning_check.py", 2, timeout=300)


def test_the_same_lightning_script_runs_under_torchrun():
    """tests/scripts/lightning_check.py unchanged: `gradwire run` starts one rank per host
    (num_nodes=2, devices=1), torchrun two on one node (num_nodes=1, devices=2);
    ``launch_args`` tells the Trainer which."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(SCRIPTS / "lightning_check.py")],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "FAIL" not in out, out[-3000:]
    assert out.count("failures=0") == 2, out[-3000:]


@pytest.mark.parametrize("env,want", [
    ({}, {"num_nodes": 1, "devices": 3}),
    ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}, {"num_nodes": 2, "devices": 1}),
    ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, {"num_nodes": 2, "devices": 4}),
])
def test_launch_args_follow_the_launcher(monkeypatch, env, want):
    from gradwire.hooks.lightning import launch_args

    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launch_args(devices=3) == want


def test_launch_args_refuse_an_inconsistent_environment(monkeypatch):
    from gradwire.hooks.lightning import launch_args

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(GradwireError, match="WORLD_SIZE 3 is not a multiple of LOCAL_WORLD"):
        launch_args()


@pytest.mark.parametrize("devices", [0, "2", 1.5, True])
def test_launch_args_refuse_a_count_of_devices_that_is_none(monkeypatch, devices):
    """Returned as given outside a launcher: Lightning refused it later, its own way."""
    from gradwire.hooks.lightning import launch_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(GradwireError, match="devices"):
        launch_args(devices=devices)


@pytest.mark.parametrize("kwargs,says", [
    ({"ddp_comm_hook": None}, "ddp_comm_hook is set by gradwire from the state"),
    ({"ddp_comm_state": None, "ddp_comm_wrapper": None}, "ddp_comm_state, ddp_comm_wrapper is set"),
])
def test_lightning_strategy_refuses_a_second_hook(kwargs, says):
    from gradwire.hooks.lightning import strategy

    with pytest.raises(GradwireError, match=says):
        strategy(gh.make("topk"), **kwargs)
    with pytest.raises(GradwireError, match="expected a gradwire.hooks.make"):
        strategy("topk")


def test_a_lightning_checkpoint_of_another_world_size_is_refused_whole():
    """Each rank takes its own entry of a checkpoint's hook states: one saved by 4 ranks and
    resumed on 2 would hand two ranks' residuals out and lose the others'. Without states (a
    checkpoint of Lightning's own DDP) the hook starts afresh."""
    from gradwire.hooks.lightning import load_hook_state

    saved = gh.make("topk").state_dict()
    fresh = gh.make("topk")
    with pytest.raises(GradwireError, match="holds 4 ranks' hook states, this run has 2 ranks"):
        load_hook_state(fresh, [saved] * 4, 0, 2, "ck.ckpt")
    load_hook_state(fresh, None, 0, 2, "ck.ckpt")
    load_hook_state(fresh, [saved, saved], 1, 2, "ck.ckpt")
    assert fresh.step == saved["step"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_lightning_checkpoint_gathers_hook_states_from_the_host(monkeypatch):
    """Gathered as they were, a GPU's residuals came back on rank 0 on the GPU they left, every
    rank's at once; the checkpoint holds them on the host."""
    import gradwire.hooks.lightning as lightning

    state = gh.make("topk")
    state.positions.numels[0] = 3
    state.ef.residuals[(0,)] = torch.ones(3, device="cuda")
    sent = []
    monkeypatch.setattr(lightning.dist, "gather_object",
                        lambda obj, out, dst: (sent.append(obj), out.__setitem__(0, obj)))
    states = lightning.gather_hook_states(state, 1, True)
    assert sent[0]["residuals"] and all(
        t.device.type == "cpu" for t in _tensors(sent[0]))
    assert states == sent


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)


def test_the_training_worker_runs_unchanged_under_plain_torchrun(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "-m", "gradwire.train.worker", "--model",
                        "mlp-small", "--agg", "gtopk", "--density", "0.05", "--epochs", "1",
                        "--batch-size", "64", "--out", str(out)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["agg"] == "gtopk" and r["world_size"] == 2 and r["iterations"] > 0
    assert r["payload_bytes_per_iter_per_rank"] > 0 and math.isfinite(r["loss"][-1])


def test_headers_go_over_one_host_group_per_set_of_ranks(one_rank, monkeypatch):
    """Under NCCL the call headers need a gloo group over the same ranks: made once, shared by
    every hook state (here NCCL is pretended: the group is gloo)."""
    import torch.distributed as dist

    from gradwire.hooks import comm

    assert comm.host_group(None) is None  # gloo: the group itself
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl" if group is None
                        else "gloo")
    made = comm.host_group(None)
    assert made is not None and comm.host_group(None) is made
    assert dist.get_process_group_ranks(made) == [0]


@pytest.mark.parametrize("method, opts", [("powersgd", {"rank": 1}), ("int8", {})])
def test_a_resumed_hook_keeps_what_its_compressor_carries_for_the_rebuilt_buckets(
        one_rank, method, opts):
    """PowerSGD's warm-start Q and int8's step sizes are saved keyed by the rebuilt buckets,
    which a new DDP makes only after its first step: they must last until then, so that from
    the second resumed step on the hook carries what an uninterrupted one does."""
    import warnings

    def kept(s):
        c = s.compressor
        return sorted({k[0] for k in c.power.memory} if method == "powersgd" else c.exponents)

    def new():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(),
                                  torch.nn.Linear(30, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
        ddp = DDP(net, bucket_cap_mb=0.002)  # one bucket a layer or two: rebuilt in reverse
        s = gh.make(method, **opts)
        s.register(ddp)
        return ddp, s

    def step(ddp, i):
        g = torch.Generator().manual_seed(1000 + i)
        x, y = torch.randn(16, 20, generator=g), torch.randn(16, 3, generator=g)
        ddp.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        whole, s = new()
        for i in range(4):
            step(whole, i)
        resumed, r = new()
        r.load_state_dict(s.state_dict())
        step(whole, 4)
        step(resumed, 4)  # DDP's construction order: the loaded state's buckets are unused
        assert set(kept(s)) <= set(kept(r))  # and kept, beside those of that step
        for i in (5, 6):
            step(whole, i)
            step(resumed, i)
            assert kept(r) == kept(s), i  # the rebuilt buckets' only, as if never stopped


@pytest.mark.parametrize("method", ["topk", "dgc"])  # its status in band, and in the header
def test_a_refused_call_leaves_the_velocity_as_it_was(one_rank, monkeypatch, method):
    """With momentum correction, ranks that disagree fail before the velocity moves, as
    before any residual changes."""
    import warnings

    from gradwire.collectives.agree import MismatchError

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 3))
    ddp = DDP(net)
    s = gh.make(method, density=0.3, momentum=0.9)
    s.register(ddp)

    def step():
        ddp.zero_grad()
        ddp(torch.ones(4, 8)).sum().backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        step()
        before = {k: v.clone() for k, v in s.state_dict()["velocities"].items()}

        def refuse(*args, **kwargs):
            raise MismatchError("ranks made different calls (test)")

        monkeypatch.setattr(comm.Comm, "agree", refuse)
        s._layouts = None  # as after a rebuild or a failed step: the next call has a header
        with pytest.raises(MismatchError):
            step()
    after = s.state_dict()["velocities"]
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("method", ["topk", "gtopk", "int8", "powersgd", "efsignsgd"])
def test_a_loaded_residual_of_another_shape_or_dtype_is_taken_as_its_values(one_rank, method):
    """A checkpoint's residuals are matched to parameters by element count: one reshaped, or
    saved from a model in another precision, resumes as its flat values in the model's dtype
    (the step is the uninterrupted one's), never failing inside the next backward."""
    import warnings

    def new():
        torch.manual_seed(0)
        ddp = DDP(torch.nn.Linear(20, 30, bias=False))
        s = gh.make(method, **({"density": 0.1} if method in ("topk", "gtopk") else {}))
        s.register(ddp)
        return ddp, s

    def step(ddp, i):
        g = torch.Generator().manual_seed(i)
        ddp.zero_grad()
        ddp(torch.randn(8, 20, generator=g)).square().mean().backward()
        return ddp.module.weight.grad.clone()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        ddp, s = new()
        step(ddp, 0)
        saved = s.state_dict()
        want = step(ddp, 1)
        for change in (lambda t: t.reshape(30, 20), lambda t: t.double()):
            other = {**saved, "residuals": {k: change(v) for k, v in saved["residuals"].items()}}
            ddp2, s2 = new()
            s2.load_state_dict(other)
            assert torch.allclose(step(ddp2, 1), want, rtol=1e-6, atol=1e-7)
            assert all(r.dtype == torch.float32 for r in s2.ef.residuals.values())
        ddp3, s3 = new()
        with pytest.raises(GradwireError, match="residual of parameter 0 must be a float "
                                                "tensor, got torch.int64"):
            s3.load_state_dict({**saved, "residuals": {0: torch.zeros(600, dtype=torch.long)}})
