"""The benchmark scripts, in what they compute or record:
bad arguments that crashed late or measured nothing, ratios over rounds not taken together,
notes that called every run contended, a figure replaced by a run that then failed, options
parsed and ignored. Cheap and deterministic: the measurements are stand-ins, in process; no
cluster, no ranks."""
import contextlib
import json
import os
from types import SimpleNamespace

import pytest
from conftest import BENCHMARKS, benchmark_argv, load_benchmark

load, argv = load_benchmark, benchmark_argv


def cores(monkeypatch, n: int) -> None:
    """This process (and the ranks it would start) may run on ``n`` cores."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: n)


def never(*a, **k):
    pytest.fail("a bad argument got as far as the measurement")


@contextlib.contextmanager
def fake_cluster(*a, **k):
    yield SimpleNamespace(label="fake", hosts=[], send_buffer_bytes=None)


def one_line_error(capsys, exc) -> str:
    """The error of a SystemExit: argparse's (code 2, on stderr) or the script's own text."""
    err = capsys.readouterr().err.strip()
    text = exc.value.code if isinstance(exc.value.code, str) else err.splitlines()[-1]
    assert exc.value.code not in (0, None)
    assert "Traceback" not in err and "\n" not in text
    return text


# --- ddp_hooks -------------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--iters", "0"], "--iters must be >= 1"),      # divided by zero in every rank
    (["--rounds", "0"], "--rounds must be >= 1"),    # wrote a result with nothing measured
    (["--batch", "0"], "--batch must be >= 1"),      # wrote NaN losses
    (["--warmup", "-1"], "--warmup must be >= 0"),   # timed the cold first iteration
    (["--hosts", "0"], "--hosts must be >= 1"),      # the cluster's traceback
    (["--hooks", "torch:fp16,torch:fp16"], "names a hook twice"),  # pooled as one hook
])
def test_ddp_hooks_refuses_bad_counts_before_any_rank(monkeypatch, capsys, args, says):
    mod = load("ddp_hooks", monkeypatch)
    monkeypatch.setattr(mod, "ephemeral_cluster", never)
    argv(monkeypatch, "ddp_hooks.py", "--loopback", *args)
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert says in one_line_error(capsys, e)


def _row(r: int, hook: str, ms: float) -> str:
    return "[rank 0] ROW " + json.dumps({"round": r, "hook": hook, "slowest_s": [ms / 1e3] * 3,
                                         "median_s": ms / 1e3, "loss": 1.0, "header_s": 0.0})


def test_ddp_hooks_after_a_failure_ratios_are_of_the_rounds_every_hook_finished(
        monkeypatch, tmp_path):
    """Round 1 runs the hooks in reverse and fails after torch's: gradwire's dense had one
    round, DDP's two, and the ratio set one round against the median of two (the second,
    slower, taken while gradwire's was not running)."""
    mod = load("ddp_hooks", monkeypatch)
    lines = [_row(0, "torch:allreduce", 100), _row(0, "gradwire:dense", 100),
             _row(1, "torch:allreduce", 300)]

    def launch(c, cmd, timeout, sink, extra_env):
        for x in lines:
            sink(x)
        return SimpleNamespace(returncode=1, message="rank 1 exited with status 1")

    monkeypatch.setattr(mod, "ephemeral_cluster", fake_cluster)
    monkeypatch.setattr(mod, "launch", launch)
    out = tmp_path / "dh.json"
    argv(monkeypatch, "ddp_hooks.py", "--loopback", "--hooks", "torch:allreduce,gradwire:dense",
         "--out", str(out))
    with pytest.raises(SystemExit):
        mod.main()
    doc = json.loads(out.read_text())
    assert doc["summary"]["torch:allreduce"]["ms_per_iter"] == pytest.approx(100)
    assert doc["speed_ratios"]["gradwire:dense vs torch:allreduce"] == pytest.approx(1.0)
    assert len(doc["rows"]) == 3 and doc["failed"]  # every row kept, the failure beside it


@pytest.mark.parametrize("n, contended", [(2, True), (16, False)])
def test_ddp_hooks_result_says_whether_its_ranks_outnumber_the_cores(monkeypatch, tmp_path, n,
                                                                      contended):
    mod = load("ddp_hooks", monkeypatch)
    cores(monkeypatch, n)

    def launch(c, cmd, timeout, sink, extra_env):
        sink(_row(0, "torch:allreduce", 100))
        return SimpleNamespace(returncode=0, message="")

    monkeypatch.setattr(mod, "ephemeral_cluster", fake_cluster)
    monkeypatch.setattr(mod, "launch", launch)
    out = tmp_path / "dh.json"
    argv(monkeypatch, "ddp_hooks.py", "--hosts", "4", "--hooks", "torch:allreduce",
         "--out", str(out))
    mod.main()
    note = json.loads(out.read_text())["note"]
    assert f"{n} cores" in note and ("contention at P=4" in note) == contended


# --- train_demo ------------------------------------------------------------------------------
def _demo(monkeypatch, tmp_path, fail: bool, n: int = 2):
    mod = load("train_demo", monkeypatch)
    cores(monkeypatch, n)
    monkeypatch.setattr(mod, "ephemeral_cluster", fake_cluster)
    monkeypatch.setattr(mod, "machine_send_buffer", lambda: 4_000_000)
    monkeypatch.setattr(mod, "cpu_probe", lambda: 1.0)

    def run_demo(cluster, aggs, base, timeout, console, plot, keep=None):
        if plot is not None:  # as run_demo does: the methods that finished drawn, then
            plot.write_text("this run's figure")
        if fail:
            raise mod.GradwireError("1 of 2 methods failed (gtopk: rank 2 exited)")
        return [{"agg": a, "samples_per_s": 100.0 * (i + 1), "test_accuracy": [0.5, 0.9]}
                for i, a in enumerate(aggs)]

    monkeypatch.setattr(mod, "run_demo", run_demo)
    out = tmp_path / "demo.json"
    out.write_text('{"the": "earlier result"}')
    out.with_suffix(".png").write_text("the earlier result's figure")
    argv(monkeypatch, "train_demo.py", "--agg", "dense,gtopk", "--rounds", "1", "--out",
         str(out))
    return mod, out


def test_train_demo_that_fails_leaves_the_earlier_figure_beside_the_earlier_json(
        monkeypatch, tmp_path, capsys):
    """The first round drew its figure over --out's .png, then the run failed: a new figure
    beside the old JSON (and the failure a traceback)."""
    mod, out = _demo(monkeypatch, tmp_path, fail=True)
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert "methods failed" in one_line_error(capsys, e)
    assert out.with_suffix(".png").read_text() == "the earlier result's figure"
    assert json.loads(out.read_text()) == {"the": "earlier result"}


@pytest.mark.parametrize("n, shared", [(2, True), (16, False)])
def test_train_demo_writes_its_figure_with_its_json_and_says_if_ranks_share_cores(
        monkeypatch, tmp_path, n, shared):
    """The note said "4 ranks share the machine's cores" on a 16-core machine too
    (results/train_demo/16cores.json, a core per rank)."""
    mod, out = _demo(monkeypatch, tmp_path, fail=False, n=n)
    mod.main()
    doc = json.loads(out.read_text())
    assert out.with_suffix(".png").read_text() == "this run's figure"
    assert f"{n} cores" in doc["note"] and ("share" in doc["note"]) == shared
    assert doc["checks"]["gtopk_over_dense_samples_per_s"] == 2.0


@pytest.mark.parametrize("args, says", [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--hosts", "0"], "--hosts must be >= 1"),
    (["--baseline", "no-such-revision"], "is not a commit of this repository"),
])
def test_train_demo_refuses_bad_arguments_before_the_cluster(monkeypatch, capsys, args, says):
    mod = load("train_demo", monkeypatch)
    monkeypatch.setattr(mod, "ephemeral_cluster", never)
    argv(monkeypatch, "train_demo.py", *args)
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert says in one_line_error(capsys, e)


# --- time_to_accuracy ------------------------------------------------------------------------
@pytest.mark.parametrize("hosts, n, contended", [(2, 2, False), (4, 16, False), (4, 2, True)])
def test_time_to_accuracy_calls_a_run_contended_only_where_ranks_outnumber_cores(
        monkeypatch, tmp_path, hosts, n, contended):
    """results/time_to_accuracy/int8_p2.json: "2 ranks on 2 cores: ranks share cores, so
    compute is contended" (every run said so, whatever its cores)."""
    import gradwire.cluster
    import gradwire.launcher

    mod = load("time_to_accuracy", monkeypatch)
    cores(monkeypatch, n)
    monkeypatch.setattr(gradwire.cluster, "ephemeral_cluster", fake_cluster)
    monkeypatch.setattr(gradwire.launcher, "launch",
                        lambda *a, **k: SimpleNamespace(returncode=0, message=""))
    monkeypatch.setattr(mod, "render", lambda doc, out: None)
    out = tmp_path / "tta.json"
    argv(monkeypatch, "time_to_accuracy.py", "--hosts", str(hosts), "--models", "mlp",
         "--hooks", "gradwire:dense", "--out", str(out))
    mod.main()
    text = json.loads(out.read_text())["contention"]
    assert f"{hosts} ranks on {n} cores" in text
    assert ("contended" in text and "no CPU contention" not in text) == contended


def test_time_to_accuracy_refuses_a_timeout_of_nothing(monkeypatch, capsys):
    mod = load("time_to_accuracy", monkeypatch)
    monkeypatch.setattr(mod, "run", never)
    argv(monkeypatch, "time_to_accuracy.py", "--timeout", "0")
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert "--timeout must be > 0" in one_line_error(capsys, e)


# --- topk_select -----------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--repeats", "0"], "--repeats must be >= 1"),        # the median of nothing
    (["--size", "0"], "--size and --repeats must be >= 1"),
    (["--densities", "0.0001"], "select at least one"),    # k = 0: timed selecting nothing
    (["--densities", "2"], "must be in (0, 1]"),
    (["--densities", "x"], "'x' is not a number"),
])
def test_topk_select_refuses_bad_arguments_in_one_line(monkeypatch, capsys, tmp_path, args,
                                                       says):
    mod = load("topk_select", monkeypatch)
    monkeypatch.setattr(mod, "write_json", never)
    argv(monkeypatch, "topk_select.py", "--size", "1000", "--out", str(tmp_path / "t.json"),
         *args)
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert says in one_line_error(capsys, e)


def test_topk_select_times_the_ways_in_turns(monkeypatch, tmp_path):
    """Each way's calls were all timed before the next way's: a drift of the machine's speed
    fell between a selector and torch.topk, the baseline the docs set beside it."""
    mod = load("topk_select", monkeypatch)
    calls: list[str] = []

    def way(name):
        return lambda *a, **k: calls.append(name)

    monkeypatch.setattr(mod, "select", SimpleNamespace(
        select=lambda x, k, how: calls.append(how), exact_topk=way("exact host"),
        threshold_topk=way("threshold host"), largest=way("largest")))
    out = tmp_path / "t.json"
    argv(monkeypatch, "topk_select.py", "--size", "100", "--densities", "0.1", "--repeats", "3",
         "--out", str(out))
    mod.main()
    ours = ["exact", "threshold", "exact host", "threshold host", "largest"]
    assert calls[:10] == ours * 2  # the untimed turn, then the first timed one
    assert set(json.loads(out.read_text())["ms"][0]) >= {"torch.topk", "select threshold"}


# --- compress_speed --------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--size", "0"], "--size must be >= 1"),
    (["--topk-size", "-5"], "--topk-size must be >= 1"),
    (["--density", "0"], "--density must be in (0, 1]"),  # recorded 0, selected one element
    (["--density", "2"], "--density must be in (0, 1]"),
])
def test_compress_speed_refuses_bad_arguments_before_measuring(monkeypatch, capsys, tmp_path,
                                                               args, says):
    mod = load("compress_speed", monkeypatch)
    for part in ("topk_selection", "encode_decode", "vote", "decode_table"):
        monkeypatch.setattr(mod, part, never)
    out = tmp_path / "cs.json"
    argv(monkeypatch, "compress_speed.py", "--topk-size", "1000", "--out", str(out), *args)
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert says in one_line_error(capsys, e) and not out.exists()


# --- header_overhead -------------------------------------------------------------------------
def test_header_overhead_times_each_call_as_its_slowest_rank(monkeypatch, capsys):
    """The ranks reported rank 0's own times: a call lasts until its slowest rank is done."""
    source = (BENCHMARKS / "ranks" / "header_overhead.py").read_text()
    assert "taking_turns" in source and "perf_counter" not in source
    mod = load("header_overhead", monkeypatch)
    monkeypatch.setattr(mod, "ephemeral_cluster", never)
    argv(monkeypatch, "header_overhead.py", "--hosts", "0")
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert "--hosts must be >= 1" in one_line_error(capsys, e)


# --- sim_validation --------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--traces", "vgg"], "--traces takes vgg16, resnet20"),   # a KeyError after calibrating
    (["--workers", "4,x"], "whole numbers >= 2"),              # int()'s ValueError
    (["--workers", "1"], "whole numbers >= 2"),
    (["--iterations", "1"], "--iterations must be >= 2"),      # a traceback after calibrating
])
def test_sim_validation_refuses_bad_arguments_before_calibrating(monkeypatch, capsys, tmp_path,
                                                                 args, says):
    from gradwire.sim import emulate

    mod = load("sim_validation", monkeypatch)
    monkeypatch.setattr(emulate, "calibrate", never)
    with pytest.raises(SystemExit) as e:
        mod.main([*args, "--out", str(tmp_path / "v.json")])
    assert says in one_line_error(capsys, e)
    assert not (tmp_path / "traces").exists()


@pytest.mark.parametrize("n, contended", [(2, 4), (5, 1), (16, 0)])
def test_sim_validation_summarises_contended_runs_apart(monkeypatch, tmp_path, n, contended):
    """Every run's error was pooled, P = 8 with 10 ranks on 2 cores beside the rest."""
    from gradwire.sim import emulate
    from gradwire.sim.trace import synthetic

    mod = load("sim_validation", monkeypatch)
    cores(monkeypatch, n)
    cal = {"alpha_s": 3e-4, "alpha_call_s": 6e-4, "alpha_transport_s": 4e-4,
           "alpha_stream_s": 2e-4, "beta_s_per_byte": 8.4e-9, "gamma_s_per_byte": 1e-10,
           "world": 2}
    monkeypatch.setattr(emulate, "calibrate", lambda *a, **k: dict(cal))
    monkeypatch.setattr(emulate, "run", lambda path, c, mechanisms, *a, **k: [
        {"mechanism": m.label, "ends": [0.1 * i for i in range(c.iterations)],
         "iteration_s": 0.1, "alpha_s": 1e-4, "link_bytes": {}} for m in mechanisms])
    monkeypatch.setattr(mod, "record", lambda *a, **k: synthetic(
        "toy", [262148, 4096], forward_s=0.01, backward_s=0.02))
    monkeypatch.setattr(mod, "plot", lambda doc, path: None)
    out = tmp_path / "v.json"
    assert mod.main(["--traces", "resnet20", "--workers", "4", "--iterations", "3",
                     "--out", str(out)]) == 0
    s = json.loads(out.read_text())["summary"]
    # P = 4: ps with 1 server (5 ranks), ring and butterfly (4), ps with 2 servers (6)
    assert s["runs"] == 4 and s["cores"] == n
    assert (s["contended"] or {"runs": 0})["runs"] == contended
    assert (s["uncontended"] or {"runs": 0})["runs"] == 4 - contended


# --- perf_validation -------------------------------------------------------------------------
@pytest.mark.parametrize("option", [["--rates", "1gbit"], ["--workers", "2"],
                                    ["--aggs", "dense"], ["--repeats", "5"],
                                    ["--fast-repeats", "5"]])
def test_perf_validation_repredict_refuses_the_options_of_a_run(monkeypatch, tmp_path, option):
    """--repredict measures nothing: these were parsed and dropped without a word."""
    mod = load("perf_validation", monkeypatch)
    monkeypatch.setattr(mod, "write_report", never)
    earlier = tmp_path / "earlier.json"
    earlier.write_text("{}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--repredict", str(earlier), *option, "--out", str(tmp_path / "new.json")])
    text = str(e.value.code)
    assert text.startswith("perf_validation.py: error: ") and option[0] in text
    assert "would be ignored" in text and "\n" not in text


def test_perf_validation_still_runs_its_default_plan(monkeypatch, tmp_path):
    mod = load("perf_validation", monkeypatch)
    got = {}
    monkeypatch.setattr(mod, "write_report",
                        lambda out, console, plan, again, command: got.update(plan=plan))
    mod.main(["--out", str(tmp_path / "pv.json")])
    plan = got["plan"]
    assert plan.workers == [2, 4] and plan.repeats == 3 and plan.fast_repeats is None
    assert len(plan.rates) == 3 and "signsgd" in plan.aggs


# --- powersgd_accuracy -----------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--worlds", "x"], "--worlds must be a comma list"),
    (["--ranks", "0"], "--ranks must be a comma list"),   # failed in the ranks
    (["--epochs", "0"], "--epochs must be >= 1"),         # an untrained model's accuracy
])
def test_powersgd_accuracy_refuses_bad_arguments_before_the_ranks(monkeypatch, capsys, args,
                                                                  says):
    mod = load("powersgd_accuracy", monkeypatch)
    monkeypatch.setattr(mod, "launch", never)
    argv(monkeypatch, "powersgd_accuracy.py", *args)
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert says in one_line_error(capsys, e)


def test_powersgd_accuracy_hands_the_ranks_what_it_records(monkeypatch, tmp_path):
    """The ranks read BATCH, LR and MOMENTUM from the environment, which the script did not
    set: an inherited LR trained with it while the result recorded lr 0.1."""
    mod = load("powersgd_accuracy", monkeypatch)
    monkeypatch.setenv("LR", "5.0")
    monkeypatch.setenv("BATCH", "7")
    seen = {}

    def launch(cluster, cmd, timeout, sink, extra_env):
        seen.update(extra_env)
        return SimpleNamespace(returncode=0, message="")

    monkeypatch.setattr(mod, "launch", launch)
    monkeypatch.setattr(mod, "loopback_cluster", lambda p: None)
    out = tmp_path / "pa.json"
    argv(monkeypatch, "powersgd_accuracy.py", "--worlds", "2", "--out", str(out))
    mod.main()
    doc = json.loads(out.read_text())
    assert float(seen["LR"]) == doc["lr"] and int(seen["BATCH"]) == doc["batch_per_rank"]
    assert float(seen["MOMENTUM"]) == doc["momentum"]


# --- collectives -----------------------------------------------------------------------------
def test_collectives_refuses_a_calibration_that_would_orphan_kept_predictions(monkeypatch,
                                                                               tmp_path):
    """--parts calibrate kept the model part, predicted from the calibration it replaced."""
    mod = load("collectives", monkeypatch)
    monkeypatch.setattr(mod, "part_calibrate", never)
    out = tmp_path / "coll.json"
    before = json.dumps({"calibration": {"beta_s_per_byte": 8e-9}, "ring": {},
                         "model": {"points": []}, "crossover": {}})
    out.write_text(before)
    argv(monkeypatch, "collectives.py", "--parts", "calibrate,crossover", "--out", str(out))
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2 and out.read_text() == before


# --- every script's --out --------------------------------------------------------------------
# "--out results/" (a folder, meant to hold the result) was Path("results"): the result went to
# a file "results", or replaced one, after the whole run; an existing folder failed only there.
@pytest.mark.parametrize("typed, says", [
    ("x/", "'x/' names a folder (it ends in /): give a file name, such as x/result.json"),
    ("x/.", "'x/.' names a folder (it ends in /.): give a file name, such as "
            "x/result.json"),
    ("f/", "'f/' names a folder (it ends in /): give a file name, such as f/result.json"),
    ("d", "'d' is a directory: give a file name"),
    ("d/", "'d' is a directory: give a file name"),
], ids=["x/", "x/.", "file/", "dir", "dir/"])
def test_out_file_refuses_a_folder(monkeypatch, tmp_path, typed, says):
    import argparse

    from gradwire.jsonfile import out_file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("kept")  # a file "f": "f/" would have replaced it
    with pytest.raises(argparse.ArgumentTypeError) as e:
        out_file(typed)
    assert str(e.value) == says  # argparse names the option: "argument --out: --out 'd'" did


@pytest.mark.parametrize("typed", ["r.json", "newdir/r.json", "d/r.json"])
def test_out_file_takes_a_file_name_in_a_folder_yet_to_be_made(monkeypatch, tmp_path, typed):
    """Only the name is checked: the scripts make the result's folder (mkdir(parents=True))."""
    from pathlib import Path

    from gradwire.jsonfile import out_file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    assert out_file(typed) == Path(typed)


def _out_options(tree):
    """The ``type=`` of every ``add_argument("--out", ...)`` in ``tree`` (None: none given)."""
    import ast
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "--out"):
            yield next((k.value for k in node.keywords if k.arg == "type"), None)


def test_every_benchmark_out_option_is_checked_as_a_file_name():
    import ast
    checked = []
    for script in sorted(BENCHMARKS.glob("*.py")):
        tree = ast.parse(script.read_text(), str(script))
        types = list(_out_options(tree))
        if not types:
            continue
        imported = any(isinstance(n, ast.ImportFrom) and n.module == "gradwire.jsonfile"
                       and any(a.name == "out_file" and a.asname is None for a in n.names)
                       for n in ast.walk(tree))
        for t in types:
            assert isinstance(t, ast.Name) and t.id == "out_file" and imported, (
                f"benchmarks/{script.name}: --out is not type=out_file (gradwire.jsonfile)")
        checked.append(script.name)
    assert {"sim_speed.py", "hook_equivalence.py", "perf_validation.py"} <= set(checked)


@pytest.mark.parametrize("typed", ["sub/", "sub/.", ""])  # "": tmp_path, a folder there
@pytest.mark.parametrize("name, stand_ins", [
    ("sim_speed", ("fresh", "write_json")),
    ("ddp_hooks", ("ephemeral_cluster", "write_json")),
    ("perf_validation", ("write_report",)),  # checked --out, but as Path("sub"): a file
])
def test_a_folder_given_as_out_is_refused_before_the_measurement(monkeypatch, capsys, tmp_path,
                                                                 name, stand_ins, typed):
    mod = load(name, monkeypatch)
    for attr in stand_ins:
        monkeypatch.setattr(mod, attr, never)
    out = f"{tmp_path}/{typed}" if typed else str(tmp_path)
    argv(monkeypatch, f"{name}.py", "--out", out)
    with pytest.raises(SystemExit) as e:
        mod.main()
    text = one_line_error(capsys, e)
    assert e.value.code == 2 and text.startswith(f"{name}.py: error: argument --out: '")
    assert (f"names a folder (it ends in {typed[3:]})" if typed else "is a directory") in text
    assert list(tmp_path.iterdir()) == []


def test_sim_speed_without_out_still_writes_its_default(monkeypatch, tmp_path):
    mod = load("sim_speed", monkeypatch)
    written = []
    monkeypatch.setattr(mod, "write_json", lambda path, doc: written.append(path))
    argv(monkeypatch, "sim_speed.py", "--ps", "", "--ring", "", "--bucketed", "")
    mod.main()
    assert written == [mod.OUT]
