"""Edges of compute traces and the simulate command: lines that only look broken, fields a trace
dropped without a word, synthetic traces that could be made but not read back, recordings of
counts that are no whole numbers, and host costs --emulate would have ignored."""
import json

import numpy as np
import pytest
from conftest import Started, one_line_cli_error, run_cli, start_here
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.errors import GradwireError
from gradwire.sim import trace as tr

HEAD = '{"format": "gradwire-trace", "version": 1, "model": "m"}'
ITER = '{"worker": 0, "iteration": 0, "forward_s": 0.1, "forward": [0.0], "backward": [0.2]}'


# ---- reading: a line is what ends at a newline, and every key of it is a field


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085"])
def test_a_name_holding_a_unicode_line_separator_reads_as_written(sep):
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped (a writer with
    ensure_ascii=False leaves them so); str.splitlines() cut the line there and the trace was
    refused as not valid JSON."""
    name = f"block{sep}conv.weight"
    param = json.dumps({"param": 0, "name": name, "bytes": 8}, ensure_ascii=False)
    assert sep in param
    t = tr.loads("\n".join([HEAD, param, ITER]) + "\n")
    assert [p.name for p in t.params] == [name]
    assert tr.loads(tr.dumps(t)) == t
    # a defect after such a line is on the line it is on; "\r\n" and "\r" still end lines
    with pytest.raises(GradwireError, match=r"^<trace>:3: field 'forward_s'"):
        tr.loads("\n".join([HEAD, param, ITER.replace("0.1", '"x"')]))
    for end in ("\r\n", "\r"):
        assert tr.loads(end.join([HEAD, param, ITER])) == t


@pytest.mark.parametrize("line, where, field, hint", [
    ('{"param": 0, "name": "a", "bytes": 8, "shpe": [2]}', 2, "shpe", "did you mean 'shape'"),
    ('{"param": 0, "name": "a", "bytes": 8, "worker": 0}', 2, "worker", "expected param"),
    (ITER[:-1] + ', "bakward": [0.0]}', 3, "bakward", "did you mean 'backward'"),
])
def test_a_key_that_is_no_field_of_its_line_is_refused(line, where, field, hint):
    """A misspelt ``shape`` was dropped without a word: the trace loaded without it, and
    PowerSGD was priced as one flat matrix per bucket."""
    lines = [HEAD, '{"param": 0, "name": "a", "bytes": 8}', ITER]
    lines[where - 1] = line
    with pytest.raises(GradwireError, match=rf"^<trace>:{where}: field '{field}': not a field") \
            as e:
        tr.loads("\n".join(lines))
    assert hint in str(e.value) and "\n" not in str(e.value)


# ---- synthetic traces: what loads() would refuse is refused when made


def test_synthetic_sizes_summed_past_int64_are_refused():
    """numpy int64 sizes summed with wrap-around: two of 2**62 bytes came to -2**63, under the
    2**50 a trace holds, and the trace was made (and written, but never read back)."""
    with np.errstate(over="ignore"), pytest.raises(GradwireError, match=r"2\*\*50 bytes"):
        tr.synthetic("m", np.array([2**62, 2**62], dtype=np.int64), 0.01, 0.02)


@pytest.mark.parametrize("model, names", [("", None), ("m", [1, 2]), ("m", ["a", ""])])
def test_a_synthetic_trace_takes_only_names_a_trace_file_holds(model, names):
    with pytest.raises(GradwireError, match="must be a non-empty string|must be non-empty "
                                            "strings"):
        tr.synthetic(model, [8, 16], 0.01, 0.02, names=names)


class _Name(str):
    """A name that counts how often it is compared."""

    compared = 0

    def __eq__(self, other):
        _Name.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_synthetic_names_are_checked_once_each_not_against_all_before():
    """Each name was looked up in the list of those before it: quadratic, a minute at the
    100,000 parameters a trace may hold."""
    n = 2000
    _Name.compared = 0
    t = tr.synthetic("m", [4] * n, 0.01, 0.02, names=[_Name(f"p{i}") for i in range(n)])
    assert len(t.params) == n
    assert _Name.compared < 4 * n


@given(names=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=6, unique=True),
       sizes=st.data())
@settings(max_examples=40, deadline=None, derandomize=True)
def test_synthetic_traces_round_trip(names, sizes):
    """Whatever synthetic() makes, loads() reads back as it was made (names of any text)."""
    nbytes = sizes.draw(st.lists(st.integers(1, 2**40), min_size=len(names),
                                 max_size=len(names)))
    t = tr.synthetic("model\u2028x", nbytes, 0.01, 0.02, 0.001, names=names)
    text = tr.dumps(t)
    assert tr.loads(text) == t
    assert tr.loads(text.replace("\\u2028", "\u2028")) == t  # as a writer of raw text has it


# ---- recording: counts are whole numbers


@pytest.mark.parametrize("kw", [{"iterations": 2.5}, {"iterations": True}, {"warmup": 0.5},
                                {"batch_size": 2.5}, {"worker": -1}])
def test_record_refuses_counts_a_trace_cannot_hold(kw):
    """A float failed in range() or torch.randint with a traceback; True recorded one
    iteration; worker -1 made a trace that loads() refuses."""
    from gradwire.sim.record import record

    with pytest.raises(GradwireError, match="trace needs whole numbers"):
        record("mlp-small", **{"iterations": 1, "batch_size": 4, **kw})


# ---- simulate --emulate: it measures the host costs


@pytest.fixture
def here(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path / "state"))
    tr.save(tr.synthetic("tiny", [1000, 2000, 3000], 0.01, 0.02), tmp_path / "in.jsonl")
    return tmp_path


@pytest.mark.parametrize("extra, said", [
    (["--alpha-us", "5"], "--alpha-us: not used with --emulate"),
    (["--latency-us", "0", "--alpha-us", "0"], "--alpha-us, --latency-us: not used with"),
    (["--calibration", "cal.json"], "--calibration: not used with --emulate"),
])
def test_emulate_refuses_host_costs_it_would_ignore(here, monkeypatch, capsys, extra, said):
    """--emulate simulates each mechanism with the α it measures and the γ of its own
    calibration: an --alpha-us, --latency-us or --calibration typed beside it was dropped
    without a word (the calibration's α even printed)."""
    import calibration_doc

    (here / "cal.json").write_text(json.dumps(calibration_doc.doc()))
    start_here(monkeypatch, "gradwire.sim.simulate", "run_simulation")
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", "in.jsonl",
                                                 "--emulate", *extra], started=(Started,))
    one_line_cli_error(code, err, said)
    # without them it starts
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", "in.jsonl", "--emulate"],
                           started=(Started,))
    assert code == 0, err


@pytest.mark.parametrize("value", ["1.0", "0.0"])
def test_a_mechanism_flag_is_on_off_1_or_0_not_a_float(value):
    """barrier=1.0 was taken as on and 0.0 as off: 1.0 == 1 in Python."""
    from gradwire.sim import mechanisms

    with pytest.raises(GradwireError, match=f"barrier must be on or off, got {value}"):
        mechanisms.parse(f"ps:barrier={value}")
    assert mechanisms.parse("ps:barrier=1").options.barrier is True
    assert mechanisms.parse("ps:barrier=0").options.barrier is False


@pytest.mark.parametrize("value, on", [("False", False), ("off", False), ("0", False),
                                       ("True", True), ("ON", True), ("yes", True)])
def test_a_compressors_flag_is_taken_as_words_in_any_case(value, on):
    """``compress=powersgd:warm_start=False`` was refused ("warm_start must be True or False,
    got 'False'"): text never reached the bool PowerSGD takes."""
    from gradwire.sim import mechanisms

    opts = mechanisms.parse(f"ring:compress=powersgd:warm_start={value}:rank=2").options
    assert opts.compressor_params == {"warm_start": on, "rank": 2}
    assert mechanisms.parse(f"ps:barrier={value}").options.barrier is on


def test_a_compressors_flag_that_is_no_word_is_one_line():
    from gradwire.sim import mechanisms

    with pytest.raises(GradwireError) as e:
        mechanisms.parse("ring:compress=powersgd:warm_start=maybe")
    assert str(e.value) == ("mechanism 'ring:compress=powersgd:warm_start=maybe': warm_start "
                            "must be on or off, got 'maybe'")
