"""The edges of what users hand in: JSON files with repeated keys or numbers too long, output
names near the file system's limit, GRADWIRE_TIMEOUT's range and digits, profiles past a
trace's bounds, and call-header fields holding text that is not ASCII."""

import json
import os

import numpy as np
import pytest

from gradwire import config
from gradwire.collectives.agree import FIELD_BYTES, FIELDS, _text, decode, encode
from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable, parse_object, written_beside
from gradwire.profiles import load, parse

PROFILE = {"format": 1, "model": "m", "forward_s": 0.01, "backward_s": 0.02,
           "params": [["w", 1000]]}


def test_a_json_integer_too_long_for_int_is_one_line():
    """json.loads raises a bare ValueError (not a JSONDecodeError) for an integer of more than
    4300 digits: it was a traceback."""
    text = json.dumps(PROFILE).replace('"backward_s": 0.02', '"backward_s": ' + "9" * 5000)
    with pytest.raises(GradwireError, match=r"^p\.json: not valid JSON here: a number too long$"):
        parse(text, "p.json")


def test_a_key_given_twice_is_refused():
    """json keeps the last of two equal keys silently: a profile's forward_s given twice was
    read as one of them."""
    text = json.dumps(PROFILE)[:-1] + ', "forward_s": 99}'
    with pytest.raises(GradwireError, match="p.json: key 'forward_s' appears twice"):
        parse(text, "p.json")
    with pytest.raises(GradwireError, match="key 'b' appears twice"):
        parse_object('{"a": [{"b": 1, "b": 1}]}', "f")
    assert parse_object('{"a": {"b": 1}, "b": {"a": 2}}', "f") == {"a": {"b": 1},
                                                                   "b": {"a": 2}}


@pytest.mark.parametrize("name", ["a" * 250 + ".json", "é" * 125 + ".json"])
def test_an_output_name_check_writable_allows_can_be_written(tmp_path, name):
    """The temporary beside a 250-byte name was longer than the 255 bytes a name may have: the
    write failed at the end of the work, after check_writable had passed the name."""
    path = check_writable(tmp_path / name, "--json")
    path.write_text("old")
    with written_beside(path) as tmp:
        assert tmp.parent == path.parent and len(os.fsencode(tmp.name)) <= 255
        tmp.write_text("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == [name]


@pytest.mark.parametrize("raw", ["1_0", "١٠", "１０", "0.0005", "1e-4"])
def test_gradwire_timeout_takes_ascii_numbers_of_a_millisecond_or_more(raw):
    """float() took "1_0" and other scripts' digits; and c10d truncates a wait's limit to whole
    milliseconds, 0 being no limit at all: GRADWIRE_TIMEOUT=0.0005 waited for ever."""
    with pytest.raises(GradwireError, match="GRADWIRE_TIMEOUT must be a number of seconds"):
        config.timeout({"GRADWIRE_TIMEOUT": raw})
    assert not config.valid_timeout(0.0005)


def test_a_timeout_may_be_a_numpy_number():
    """A limit computed with numpy (np.int64(30), np.float32(2.5)) was refused as no number;
    numpy's bools and NaN are still none."""
    assert config.valid_timeout(np.int64(30)) and config.valid_timeout(np.float32(2.5))
    assert config.check_timeout("timeout", np.int64(30)) == 30.0
    for bad in (np.bool_(True), True, np.float64("nan"), np.float64("inf"), np.int64(0)):
        assert not config.valid_timeout(bad)


@pytest.mark.parametrize("raw,seconds", [("0.001", 0.001), (" 5\n", 5.0), ("1e3", 1000.0),
                                         ("2000000", 2e6)])
def test_gradwire_timeout_still_takes(raw, seconds):
    assert config.timeout({"GRADWIRE_TIMEOUT": raw}) == seconds


def test_a_long_header_value_that_is_not_ascii_stays_in_its_field():
    """A long value was cut to 15 characters, not bytes: 15 'ρ' are 30 bytes, so the value ran
    into the next field (or past the compared ones, over its checksum), and two different
    calls could pass for one."""
    value = "block=" + "ρ" * 24
    assert len(_text(value + "1").encode()) <= FIELD_BYTES
    a = [("call", "allreduce"), ("algo", "ring"), ("elements", 10), ("dtype", "float32"),
         ("root", 0), ("params", value + "1")]
    b = [*a[:5], ("params", value + "2")]
    compared = len(a) * FIELD_BYTES
    assert not bool((encode(a)[:compared] == encode(b)[:compared]).all())
    fields = decode(encode([("call", "x"), ("method", "méthode" + "é" * 20), ("mode", "a")]))
    assert fields[2] == "a" and fields[1].startswith("méthode") and len(fields) == FIELDS + 1


@pytest.mark.parametrize("change,field", [
    ({"params": [["w", 10**30]]}, "'params' must hold at most 2\\*\\*50 bytes"),
    ({"params": [["w", 2**49], ["b", 2**49]], "dtype": "float16"}, "'params' must hold"),
    ({"forward_s": 1e308}, "'forward_s' must be at most 1e\\+06 seconds, got 1e\\+308"),
    ({"backward_layer_s": [1e300], "backward_s": None}, "'backward_layer_s' must be"),
])
def test_a_profile_with_sums_that_overflow_is_refused(change, field):
    """Such a profile was taken, and whatif printed iteration times of 1e25 ms or inf, with
    efficiencies of nan %."""
    with pytest.raises(GradwireError, match=f"p.json: field {field}"):
        parse(json.dumps({**PROFILE, **change}), "p.json")


def test_a_profile_name_too_long_for_a_path_is_one_line():
    with pytest.raises(GradwireError, match="unknown profile"):
        load("a" * 300)
    with pytest.raises(GradwireError, match="not found"):
        load("a" * 300 + ".json")
