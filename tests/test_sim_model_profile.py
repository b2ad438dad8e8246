"""``gradwire simulate --model NAME``: a trace made from a model profile (built-in or measured),
the profiles whatif and advise read, so that the ImageNet models can be simulated without a
recording of them (``gradwire trace`` records only the models gradwire trains)."""

import json

import pytest
from conftest import cli_error, one_line_cli_error, run_cli

from gradwire import profiles
from gradwire.errors import GradwireError
from gradwire.profiles import Profile
from gradwire.sim.trace import from_profile, save, synthetic


def test_a_builtin_profile_gives_its_tensors_in_forward_order_and_its_pass_times():
    prof = profiles.load("resnet50")
    t = from_profile(prof, "--model resnet50")
    assert [p.name for p in t.params] == [nm for nm, _ in reversed(prof.params)]
    assert t.total_bytes == prof.numel * 4
    it = t.iterations[0]
    assert it.forward_s == prof.forward_s and it.forward[0] == 0.0
    # no per-layer times: each gradient is ready once the elements after it have been done
    n = [n for _, n in reversed(prof.params)]
    for i in (0, 1, len(n) // 2, len(n) - 1):
        assert it.backward[i] == pytest.approx(prof.backward_s * sum(n[i:]) / prof.numel,
                                               rel=1e-9)
    assert it.backward_s == pytest.approx(prof.backward_s, rel=1e-12)
    assert "in proportion to their elements" in t.source


def test_measured_layer_times_are_kept():
    prof = Profile("m", (("b", 10), ("a", 30)), 0.004, 0.010, backward_layer_s=(0.003, 0.007))
    it = from_profile(prof, "--model m.json").iterations[0]
    # forward order a, b; b's layer runs first in backward
    assert it.backward == pytest.approx((0.010, 0.003))
    assert it.forward == (0.0, 0.002)


def test_a_profile_without_compute_times_is_refused():
    with pytest.raises(GradwireError, match="alexnet.*no compute times.*gradwire profile"):
        from_profile(profiles.load("alexnet"), "--model alexnet")


def test_backward_layers_must_be_one_time_per_parameter():
    with pytest.raises(GradwireError, match="backward layers must be 2 times"):
        synthetic("m", [4, 4], 0.1, 0.2, backward_layers=[0.2])


def _iteration_s(out: str, mechanism: str) -> float:
    return {r["mechanism"]: r["iteration_s"] for r in json.loads(out)["results"]}[mechanism]


def test_simulate_model_runs_the_trace_it_makes(monkeypatch, capsys, tmp_path):
    common = ["--workers", "8", "--bandwidth", "10gbit", "--mechanism", "ring,ps"]
    code, out, err = run_cli(monkeypatch, capsys, ["simulate", "--model", "vgg16", *common,
                                                   "--json", str(tmp_path / "m.json")])
    assert code == 0, err
    assert "trace of --model vgg16: forward 98.2 ms" in " ".join(out.split())
    trace = save(from_profile(profiles.load("vgg16"), "x"), tmp_path / "vgg16.trace.jsonl")
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", str(trace), *common,
                                                 "--json", str(tmp_path / "t.json")])
    assert code == 0, err
    by_model, by_trace = ((tmp_path / f).read_text() for f in ("m.json", "t.json"))
    for m in ("ring", "ps"):
        assert _iteration_s(by_model, m) == _iteration_s(by_trace, m) > 0.358
    # the result says what was simulated, not only the command that did
    doc = json.loads(by_model)
    assert doc["traces"][0]["model"] == "vgg16" and doc["traces"][0]["tensors"] == 32
    assert doc["traces"][0]["source"].startswith("--model vgg16: forward 98.2 ms")
    assert doc["cluster"] == {"workers": 8, "bandwidth": "10gbit", "bandwidth_bps": 1e10,
                              "servers": 1, "alpha_s": 1e-5, "latency_s": 1.5e-6,
                              "gamma_s_per_byte": 0.0, "iterations": 3, "seed": 0}
    assert json.loads(by_trace)["traces"][0]["source"].startswith("x: forward 98.2 ms")


@pytest.mark.parametrize("args, says", [
    (["--model", "resnet50", "--trace", "x.jsonl"], "not with --trace"),
    (["--model", "resnet50", "--emulate"], "--emulate replays a recorded trace"),
    (["--model", "bert"], "unknown profile 'bert'"),
    (["--model", "resnet20"], "profile 'resnet20' has no compute times"),
    ([], "or --model NAME"),
])
def test_simulate_model_refusals_are_one_line(monkeypatch, capsys, args, says):
    one_line_cli_error(*cli_error(monkeypatch, capsys, "simulate", *args), says)


def test_a_recorded_trace_named_as_a_builtin_profile_says_which_is_which(monkeypatch, capsys,
                                                                          tmp_path):
    """`gradwire trace --model resnet50` records gradwire's digits ResNet-50 (23.5 M
    parameters); `simulate --model resnet50` makes ImageNet's (25.6 M) from the built-in
    profile: the same name, two models."""
    from gradwire.cli import options
    from gradwire.sim import edit

    mine = synthetic("resnet50", [40, 400], 0.01, 0.02, names=["fc.bias", "fc.weight"],
                     shapes=[[10], [10, 10]])
    monkeypatch.setattr(edit, "make_trace", lambda *a, **k: mine)
    monkeypatch.setattr(options.console, "width", 1000)
    out_file = str(tmp_path / "r.jsonl")
    code, out, err = run_cli(monkeypatch, capsys, ["trace", "--model", "resnet50", "-o",
                                                   out_file])
    assert code == 0, err
    assert ("note: this is gradwire's resnet50 as it trains here (110 parameters); whatif, "
            "advise and simulate --model resnet50 read the built-in profile of that name "
            f"(ResNet-50 v1.5 as torchvision resnet50, 25,557,032 parameters); give simulate "
            f"this trace as --trace {out_file}") in out
    # an edit changes the tensors: the recording's count is not there to compare
    code, out, err = run_cli(monkeypatch, capsys, ["trace", "--model", "resnet50", "-o",
                                                   out_file, "--add-layers", "1"])
    assert code == 0 and "note:" not in out, err
    monkeypatch.setattr(edit, "make_trace", lambda *a, **k: mine.__class__(
        "mlp", mine.params, mine.iterations))
    code, out, err = run_cli(monkeypatch, capsys, ["trace", "--model", "mlp", "-o", out_file])
    assert code == 0 and "note:" not in out, err


def test_a_trace_given_as_a_profile_and_a_profile_given_as_a_trace_say_so(monkeypatch, capsys,
                                                                           tmp_path):
    """Each was read as its own kind and failed as JSON that was not valid: 'line 2, column
    1: not valid JSON: Extra data' for a trace given as --model, 'line 1, column 2' for a
    profile given as --trace."""
    trace = save(synthetic("m", [4, 4], 0.1, 0.2), tmp_path / "m.trace.jsonl")
    prof = tmp_path / "m.json"
    prof.write_text(profiles.load("resnet50").to_text())
    for args, says in ((["simulate", "--model", str(trace)], "is a compute trace (`gradwire "
                        "trace`), not a model profile: simulate takes it as --trace FILE"),
                       (["whatif", "--model", str(trace), "--workers", "4", "--bandwidth",
                         "1gbit"], "is a compute trace"),
                       (["simulate", "--trace", str(prof)], f"{prof} is a model profile "
                        f"(`gradwire profile`), not a trace: simulate takes it as --model "
                        f"{prof}")):
        one_line_cli_error(*cli_error(monkeypatch, capsys, *args), says)


@pytest.mark.parametrize("text", ["{\n", '{"format": 1}\nnot json\n', "[1, 2]\n{\n",
                                  '{"format": "gradwire-trace"}\n'])
def test_other_bad_files_keep_their_json_errors(text):
    from gradwire.sim.trace import loads

    with pytest.raises(GradwireError) as e:
        profiles.parse(text, "x.json")
    assert "compute trace" not in str(e.value)
    with pytest.raises(GradwireError) as e:
        loads(text, "x.jsonl")
    assert "model profile" not in str(e.value)


def test_compute_ms_gives_a_profile_without_times_its_own(monkeypatch, capsys, tmp_path):
    """bert-base's profile has sizes and no compute times: whatif and advise took
    --compute-ms for it, simulate --model refused it with no way to give them."""
    from gradwire.cli import options

    monkeypatch.setattr(options.console, "width", 1000)
    code, out, err = run_cli(monkeypatch, capsys, [
        "simulate", "--model", "bert-base", "--compute-ms", "100,200", "--mechanism", "ring",
        "--workers", "8", "--json", str(tmp_path / "b.json")])
    assert code == 0, err
    assert "trace of --model bert-base: forward 100 ms spread evenly over" in out
    assert "backward 200 ms" in out
    assert _iteration_s((tmp_path / "b.json").read_text(), "ring") > 0.3


@pytest.mark.parametrize("args, says", [
    (["--trace", "x.jsonl", "--compute-ms", "1,2"], "--compute-ms sets a model profile's "
     "times: give --model NAME too"),
    (["--model", "bert-base", "--compute-ms", "1,2,3"], "expected FORWARD,BACKWARD in ms"),
    (["--model", "bert-base", "--compute-ms", "0,2"], "each value must be a finite number > 0"),
    (["--model", "alexnet"], "give them (--compute-ms FORWARD,BACKWARD)"),
])
def test_compute_ms_refusals_are_one_line(monkeypatch, capsys, args, says):
    one_line_cli_error(*cli_error(monkeypatch, capsys, "simulate", *args), says)


def test_simulate_will_not_write_over_the_profile_it_reads(monkeypatch, capsys, tmp_path):
    """`simulate --model p.json --json p.json` replaced the profile with its result: --model
    was not among the inputs the outputs are checked against (whatif's and advise's is)."""
    prof = tmp_path / "p.json"
    prof.write_text(profiles.load("resnet50").to_text())
    before = prof.read_text()
    for option in ("--json", "--timeline"):
        one_line_cli_error(*cli_error(monkeypatch, capsys, "simulate", "--model", str(prof),
                                      "--workers", "4", "--mechanism", "ring", option,
                                      str(prof)), "is the file --model reads")
    assert prof.read_text() == before


def test_several_models_make_one_table_and_are_refused_elsewhere(monkeypatch, capsys,
                                                                 tmp_path):
    """--model given twice kept the last one only, where --table compares models (as
    several --trace files do)."""
    code, out, err = run_cli(monkeypatch, capsys, [
        "simulate", "--model", "resnet50", "--model", "vgg16", "--model", "resnet50",
        "--table", "6", "--workers", "4", "--json", str(tmp_path / "t.json")])
    assert code == 0, err
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["resnet50", "vgg16"]
    one_line_cli_error(*cli_error(monkeypatch, capsys, "simulate", "--model", "resnet50",
                                  "--model", "vgg16"), "2 --model profiles: only --table")


def test_a_calibrations_compute_slowdown_scales_a_profiles_compute(monkeypatch, capsys,
                                                                    tmp_path):
    """whatif and advise run a profile's compute × the calibration's compute slowdown (a
    profile is timed alone); simulate --model took its α and γ only, so the same profile and
    calibration gave two compute times. A recorded trace is left as it was recorded."""
    import calibration_doc

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(calibration_doc.doc(compute_slowdown=2.0)))
    args = ["simulate", "--model", "resnet50", "--workers", "4", "--mechanism", "ring",
            "--calibration", str(cal)]
    code, out, err = run_cli(monkeypatch, capsys, [*args, "--json", str(tmp_path / "m.json")])
    assert code == 0 and "compute ×2" in out, err
    got = json.loads((tmp_path / "m.json").read_text())["results"][0]
    assert got["compute_s"] == pytest.approx(2 * (0.061 + 0.122), rel=1e-6)
    trace = save(from_profile(profiles.load("resnet50"), "x"), tmp_path / "r.trace.jsonl")
    code, out, err = run_cli(monkeypatch, capsys, [
        "simulate", "--trace", str(trace), "--workers", "4", "--mechanism", "ring",
        "--calibration", str(cal), "--json", str(tmp_path / "t.json")])
    assert code == 0 and "compute ×" not in out, err
    got = json.loads((tmp_path / "t.json").read_text())["results"][0]
    assert got["compute_s"] == pytest.approx(0.061 + 0.122, rel=1e-6)


def test_a_profile_written_on_one_line_given_as_a_trace_says_so(monkeypatch, capsys, tmp_path):
    """Its one line read as a trace's header: "field 'format': expected 'gradwire-trace',
    got 1"."""
    compact = tmp_path / "c.json"
    compact.write_text(json.dumps(profiles.load("resnet50").to_json()))
    one_line_cli_error(*cli_error(monkeypatch, capsys, "simulate", "--trace", str(compact)),
                       "is a model profile (`gradwire profile`), not a trace")


@pytest.mark.parametrize("v, shown", [(5.2594123, "5.2594"), (0.1942, "0.1942"),
                                      (0.0123, "0.0123"), (0.0019441, "0.00194"),
                                      (0.000312, "0.000312"), (0.0, "0.0000"),
                                      (2.5e-9, "0.00000000250"), (5.2e-18, "0.0000"),
                                      (-5.2e-18, "0.0000")])
def test_simulated_times_keep_three_significant_digits(v, shown):
    """Four decimals showed a small model's iteration as 0.0019 s and its compute as 0.0003 s:
    one or two significant digits. A subtraction's rounding showed as 0.00000000000000000520
    (or -0.0000)."""
    from gradwire.sim.report import seconds

    assert seconds(v) == shown
