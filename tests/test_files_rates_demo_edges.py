"""Core helpers where they told the user less than what happened, or lost it: a ``~`` in a
GRADWIRE_* folder that names no home (a traceback), a demo figure that could not be written
hiding where its results were saved instead, a rate printed with fewer digits than it was
given (two rates merged), and a long result name that no fallback file could take."""
import errno
import json
import os
from pathlib import Path

import pytest
from conftest import cli_error, one_line_cli_error, run_cli
from hypothesis import given
from hypothesis import strategies as st

from gradwire import config
from gradwire.bandwidth import MODEL_MOST, format_bandwidth, parse_bandwidth
from gradwire.errors import GradwireError
from gradwire.jsonfile import NAME_MAX, save_elsewhere

NO_SUCH_USER = "~gradwire-no-such-user-7f3a"


# ---- config: a "~" that names no home


def test_a_state_dir_whose_tilde_names_no_home_is_one_line(monkeypatch, capsys):
    """pathlib's expanduser raised RuntimeError("Could not determine home directory."): a
    traceback from `gradwire cluster status`."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", f"{NO_SUCH_USER}/state")
    code, err = cli_error(monkeypatch, capsys, "cluster", "status")
    one_line_cli_error(code, err, "GRADWIRE_STATE_DIR", NO_SUCH_USER)


def test_a_home_whose_tilde_names_no_home_is_a_gradwire_error(monkeypatch):
    monkeypatch.setenv("GRADWIRE_HOME", f"{NO_SUCH_USER}/cache")
    with pytest.raises(GradwireError, match="GRADWIRE_HOME .*full path"):
        config.home()
    monkeypatch.setenv("GRADWIRE_HOME", "~/cache")  # a "~" that does name one still expands
    assert config.home() == Path.home() / "cache"


# ---- the demo: a figure that cannot be written


def _result(agg: str) -> dict:
    return {"agg": agg, "density": 0.001, "density_per_epoch": [0.001, 0.001],
            "model": "mlp-small", "parameters": 1000, "world_size": 2, "samples_per_s": 100.0,
            "wire_tx_bytes_per_iter_per_rank": None, "payload_bytes_per_iter_per_rank": 4000,
            "wall_s": 1.0, "loss": [2.0, 1.0], "test_accuracy": [0.5, 0.7],
            "epoch_wall_s": [0.5, 1.0],
            "seconds_per_iter": dict.fromkeys(("compute", "compress", "communicate", "step"),
                                              0.01)}


def test_a_full_disk_under_the_figure_still_says_where_the_results_went(monkeypatch, capsys,
                                                                        tmp_path):
    """--json could not be written and went elsewhere; then the figure's OSError left
    run_demo before its one line, which said where the results were saved and which method
    had failed: the user saw only the figure's error (naming its temporary file)."""
    import gradwire.cli.options
    import gradwire.demo
    import gradwire.report

    def train_on(cluster, cfg, label, timeout, console):
        if label == "topk":
            raise GradwireError("topk failed: rank 1 exited with code 1")
        return _result(label)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gradwire.demo, "train_on", train_on)
    monkeypatch.setattr(gradwire.cli.options, "replace_text", full)
    monkeypatch.setattr(gradwire.report, "save_figure", full)
    monkeypatch.chdir(tmp_path)  # where the results are saved instead
    png = tmp_path / "d.png"
    code, stdout, err = run_cli(monkeypatch, capsys, [
        "demo", "--loopback", "--hosts", "2", "--agg", "dense,topk", "--json",
        str(tmp_path / "r.json"), "--plot", str(png)])
    one_line_cli_error(code, err, "1 of 2 methods failed (topk failed", "result saved to",
                       f"could not write {png} (No space left on device)")
    (kept,) = tmp_path.glob("gradwire-r-*.json")
    assert [r["agg"] for r in json.loads(kept.read_text())] == ["dense"]


# ---- format_bandwidth: the inverse of parse_bandwidth


@given(st.integers(1, 10**9), st.integers(0, 9), st.sampled_from(["kbit", "mbit", "gbit",
                                                                   "tbit"]))
def test_every_rate_prints_as_itself(digits, point, unit):
    """Six significant digits ("g") printed 1.2345678gbit as 1.23457gbit: not the rate given,
    and two rates that differ past the sixth digit printed alike, so whatif took them for
    one and dropped a column."""
    text = str(digits).rjust(point + 1, "0")
    text = f"{text[:len(text) - point]}.{text[len(text) - point:]}" if point else text
    try:
        bps = parse_bandwidth(text + unit, most=MODEL_MOST)
    except GradwireError:  # out of range
        return
    assert parse_bandwidth(format_bandwidth(bps), most=MODEL_MOST) == bps


def test_rates_that_differ_print_differently():
    a, b = (parse_bandwidth(t) for t in ("1.2345678gbit", "1.2345679gbit"))
    assert format_bandwidth(a) == "1.2345678gbit" and format_bandwidth(b) == "1.2345679gbit"
    # the short forms are as they were
    assert [format_bandwidth(parse_bandwidth(t)) for t in
            ("100kbit", "0.534gbit", "2.5gbit", "1000mbit")] == [
        "100kbit", "534mbit", "2.5gbit", "1gbit"]


@pytest.mark.parametrize("text, bps", [(".5gbit", 5e8), ("5.gbit", 5e9), ("+.25mbit", None),
                                       (".gbit", None), ("1..5gbit", None), (".5 gbit", None)])
def test_a_rate_takes_a_decimal_as_the_cli_s_numbers_do(text, bps):
    """".5" is a number to every number option (parse_number), but ".5gbit" was refused as
    "not valid" while "0.5gbit" was taken; a sign, a lone point or a space inside still are."""
    if bps is None:
        with pytest.raises(GradwireError, match="is not valid"):
            parse_bandwidth(text)
    else:
        assert parse_bandwidth(text) == bps == parse_bandwidth(f"0{text}")


@pytest.mark.parametrize("text", ["1e2", "4.0", "2.5", "0x10", "1_0"])
def test_a_sweep_of_workers_or_layers_takes_whole_numbers_as_workers_does(text):
    """`simulate --workers 1e2` is refused ("not a whole number") while `--sweep workers=1e2`
    ran 100 workers: the sweep read each value as a float. Both take ASCII digits now."""
    from gradwire.sim.simulate import sweep_value

    for axis in ("workers", "layers"):
        with pytest.raises(GradwireError, match=f"--sweep {axis}: {text!r} is not valid"):
            sweep_value(axis, text)
    assert sweep_value("workers", "+100") == 100 and sweep_value("speedup", "1e0") == 1


# ---- save_elsewhere: a long name


@pytest.mark.parametrize("name", ["a" * 240 + ".json", "a" + "é" * 127 + ".json"])
def test_a_long_result_name_is_still_saved_to_a_file(monkeypatch, tmp_path, capsys, name):
    """A 245-byte name, which check_writable allows, made mkstemp's "gradwire-NAME-XXXXXXXX"
    longer than a file name may be, in both folders: the result went to stdout only."""
    monkeypatch.chdir(tmp_path)
    said = save_elsewhere(Path(name), '{"kept": 1}\n')
    assert said.startswith("result saved to "), said
    kept = Path(said.removeprefix("result saved to "))
    assert kept.parent == tmp_path and len(os.fsencode(kept.name)) <= NAME_MAX
    assert kept.name.startswith("gradwire-a") and kept.suffix == ".json"
    assert json.loads(kept.read_text(encoding="utf-8")) == {"kept": 1}
    assert capsys.readouterr().out == ""


# ---- data.digits: the least test fraction it names


def test_the_least_test_fraction_named_is_one_that_is_taken():
    """The message rounded 1/1797 to nearest, "at least 0.000556", which left the test split
    empty too."""
    from gradwire.data import digits

    with pytest.raises(GradwireError, match=r"expected at least [0-9.e-]+$") as e:
        digits(0, 1e-9)
    least = float(str(e.value).rsplit(" ", 1)[1])
    train, test = digits(0, least)
    assert len(test) == 1 and len(train) == 1796


# ---- parse_object: a lone surrogate


def test_a_lone_surrogate_in_a_profile_is_one_line_not_a_traceback_after_the_work(
        monkeypatch, capsys, tmp_path):
    """json reads "\\ud800" as a str that no UTF-8 writer takes: whatif priced the profile,
    then printing its name failed with a UnicodeEncodeError traceback, and no --json."""
    from gradwire.profiles import load

    doc = json.loads(load("alexnet").to_text()) | {"model": "x\ud800y"}
    (tmp_path / "p.json").write_text(json.dumps(doc), encoding="ascii")  # "\ud800" escaped
    monkeypatch.chdir(tmp_path)
    code, err = cli_error(monkeypatch, capsys, "whatif", "--model", "p.json", "--workers", "4",
                          "--bandwidth", "1gbit", "--compute-ms", "10,20", "--json", "out.json")
    one_line_cli_error(code, err, "p.json: not valid JSON here", "lone surrogate")
    assert not (tmp_path / "out.json").exists()


def test_escaped_characters_that_are_whole_are_read():
    from gradwire.jsonfile import parse_object

    assert parse_object('{"a": "\\ud83d\\ude00 \\u00e9"}', "x") == {"a": "\U0001F600 \u00e9"}
