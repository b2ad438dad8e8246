"""Bounds of the numbers commands are given, and lists that name a value twice: a cluster term
far past any cluster's is one line (whatif and advise printed "inf ms" and 300-digit times, the
simulator overflowed), a count of iterations is bounded as `gradwire trace` bounds it, a
value given twice in a list runs once, and a number option written as "1_0" is refused, as
gradwire.check's policy says."""

import warnings

import pytest
from conftest import Started, cli_error, run_cli, strict_json

from gradwire.errors import GradwireError
from gradwire.sim.cluster import SimCluster
from gradwire.sim.trace import save, synthetic

PERF = ["--model", "resnet50", "--workers", "8", "--bandwidth", "10gbit", "--agg", "dense"]


def one_line_error(monkeypatch, capsys, args: list[str], message: str) -> None:
    code, err = cli_error(monkeypatch, capsys, *args)
    assert code == 2, err
    assert err.startswith("gradwire: error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err, err


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.jsonl"
    save(synthetic("tiny", [1000, 2000, 3000], 0.01, 0.02), path)
    return str(path)


@pytest.mark.parametrize("command", ["whatif", "advise"])
@pytest.mark.parametrize(("option", "bound", "over", "message"), [
    ("--alpha-us", "1e6", "1e308", "--alpha-us must be at most 1e+06 (1 s per step"),
    ("--gamma-ns", "1000", "1e308", "--gamma-ns must be at most 1000 (1 µs per byte"),
    ("--overlap-slowdown", "100", "1e308", "--overlap-slowdown must be at most 100"),
    ("--compute-speedup", "1e-6", "1e-308", "--compute-speedup must be a number from 1e-06 to "
                                            "1e+06, got 1e-308"),
    ("--compute-ms", "1e9,1e9", "1e300,1e300", "--compute-ms '1e300,1e300': each time must be "
                                               "at most 1e+09 ms, got 1e+300"),
])
def test_cluster_terms_past_any_cluster_are_one_line(monkeypatch, capsys, tmp_path, command,
                                                     option, bound, over, message):
    """Each term at its bound still predicts finite times (strict JSON, no inf); past it, one
    line naming the bound. They printed "inf ms", an iteration of 1e304 s, or a time
    hundreds of digits long."""
    out = tmp_path / "out.json"
    code, _, err = run_cli(monkeypatch, capsys, [command, *PERF, option, bound, "--json",
                                                 str(out)])
    assert code == 0, err
    doc = strict_json(out.read_text())
    times = [r["iteration_s"] for r in doc["rows" if command == "whatif" else "ranked"]]
    assert times and all(0 < t < 1e12 for t in times), times
    one_line_error(monkeypatch, capsys, [command, *PERF, option, over], message)


@pytest.mark.parametrize("command", ["whatif", "advise"])
def test_a_value_just_past_a_bound_does_not_read_as_the_bound(monkeypatch, capsys, command):
    """1000001 was shown as 1e+06, the bound itself: "must be at most 1e+06 ..., got 1e+06"."""
    one_line_error(monkeypatch, capsys, [command, *PERF, "--alpha-us", "1000001"],
                   "--alpha-us must be at most 1e+06 (1 s per step: slower than any network), "
                   "got 1000001.0")


def test_sim_cluster_shows_a_value_just_past_its_bound_in_full():
    with pytest.raises(GradwireError, match=r"^alpha must be at most 1e\+06 seconds, got "
                                            r"1000000\.5$"):
        SimCluster(2, 1e9, alpha=1000000.5)


def test_a_compute_speedup_that_slows_compute_past_a_profiles_bound_is_one_line(monkeypatch,
                                                                                capsys):
    one_line_error(monkeypatch, capsys,
                   ["whatif", *PERF, "--compute-ms", "1e9,1e9", "--compute-speedup", "1,1e-6"],
                   "--compute-speedup 1e-06 would make a pass of resnet50 take 1e+12 s: "
                   "compute times go up to 1e+06 s")


@pytest.mark.parametrize("option", ["--alpha-us", "--latency-us"])
def test_simulate_bounds_latency_and_alpha(monkeypatch, capsys, tiny, option):
    """--alpha-us 1e308 was simulated: a numpy overflow warning and rows of garbage. The bound
    is whatif's and advise's (1 s)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_line_error(monkeypatch, capsys, ["simulate", "--trace", tiny, "--workers", "2",
                                             option, "1e308"],
                       f"{option} must be a finite number >= 0 and <= 1e+06, got 1e+308")


@pytest.mark.parametrize("field", ["latency", "alpha"])
def test_sim_cluster_bounds_latency_and_alpha(field):
    SimCluster(2, 1e9, **{field: 1e6})
    with pytest.raises(GradwireError, match=rf"^{field} must be at most 1e\+06 seconds, got "
                                            r"1e\+308$"):
        SimCluster(2, 1e9, **{field: 1e308})


def _started(*args, **kwargs):
    raise Started


@pytest.mark.parametrize(("args", "message"), [
    (["--iters", "99999999999999"], "--iters must be from 1 to 1000, got 99999999999999"),
    (["--warmup", "1001"], "--warmup must be from 0 to 1000, got 1001"),
])
def test_profile_iterations_are_bounded_as_trace_does(monkeypatch, capsys, args, message):
    """`gradwire profile --iters 99999999999999` set out to run for ever."""
    monkeypatch.setattr("gradwire.profiles.measure.get_spec", _started)
    one_line_error(monkeypatch, capsys, ["profile", "--model", "mlp", *args], message)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"iters": 10**14}, r"^profile: iters must be from 1 to 1000, got 100000000000000$"),
    ({"warmup": 1001}, r"^profile: warmup must be from 0 to 1000, got 1001$"),
])
def test_measure_bounds_its_iterations(monkeypatch, kwargs, message):
    from gradwire.profiles.measure import measure

    monkeypatch.setattr("gradwire.profiles.measure.get_spec", _started)
    with pytest.raises(GradwireError, match=message):
        measure("mlp", **kwargs)


def test_a_mechanism_named_twice_runs_once(monkeypatch, capsys, tmp_path, tiny):
    out = tmp_path / "out.json"
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", tiny, "--workers", "2",
                                                 "--mechanism", "ps,ring, ps", "--json",
                                                 str(out)])
    assert code == 0, err
    assert [r["mechanism"] for r in strict_json(out.read_text())["results"]] == ["ps", "ring"]


def test_a_sweep_value_or_mechanism_named_twice_is_one_point(monkeypatch, capsys, tmp_path,
                                                             tiny):
    """--sweep workers=2,2 ran twice, and --mechanism ps,ps printed two lines of which the
    JSON, keyed by name, kept one."""
    out = tmp_path / "out.json"
    code, stdout, err = run_cli(monkeypatch, capsys, [
        "simulate", "--trace", tiny, "--mechanism", "ps,ps", "--sweep", "workers=2,4,02",
        "--json", str(out)])
    assert code == 0, err
    rows = strict_json(out.read_text())["rows"]
    assert [r["value"] for r in rows] == [2, 4]
    assert all(list(r["iteration_s"]) == ["ps"] for r in rows)
    assert stdout.count("workers=2:") == 1 and stdout.count(" ps ") == 2, stdout


@pytest.mark.parametrize(("args", "option", "bad", "good"), [
    (["advise", *PERF[:2], *PERF[4:]], "--workers", "1_0", "10"),
    (["advise", *PERF[:-1], "powersgd"], "--rank", "1_0", "+4"),
    (["whatif", *PERF], "--ranks-per-node", "2_0", " 2"),
    (["advise", *PERF], "--bucket-mb", "2_5", "25"),
    (["whatif", *PERF[:-1], "topk"], "--density", "0_5", "0.5"),
    (["whatif", *PERF], "--alpha-us", "1_0", "1e1"),
])
def test_number_options_refuse_underscores(monkeypatch, capsys, args, option, bad, good):
    """typer (pydantic) read "1_0" as 10: `advise --workers 1_0` ran on 10 workers, and
    `--density 0_5` meant 5. gradwire.check's policy refuses underscores in typed numbers,
    as the comma-list options already did."""
    code, _, err = run_cli(monkeypatch, capsys, [*args, option, good])
    assert code == 0, err
    what = "a number" if option in ("--bucket-mb", "--density", "--alpha-us") else \
        "a whole number"
    one_line_error(monkeypatch, capsys, [*args, option, bad],
                   f"Invalid value for '{option}': '{bad}' is not {what} (ASCII digits")



def test_sim_cluster_bounds_gamma_as_whatif_does():
    """γ = 1e300 s per byte ran on to a numpy overflow warning before its one-line error."""
    SimCluster(2, 1e9, gamma=1e-6)
    with pytest.raises(GradwireError, match=r"^gamma must be at most 1e-06 seconds per byte, "
                                            r"got 1e\+300$"):
        SimCluster(2, 1e9, gamma=1e300)
