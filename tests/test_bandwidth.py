import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradwire.bandwidth import format_bandwidth, parse_bandwidth
from gradwire.errors import GradwireError


@pytest.mark.parametrize("text,bps", [("100mbit", 1e8), ("1gbit", 1e9), ("10gbit", 1e10),
                                      ("25gbit", 2.5e10), ("2.5GBIT", 2.5e9), ("none", None)])
def test_parse(text, bps):
    assert parse_bandwidth(text) == bps


@pytest.mark.parametrize("bad", ["", "1", "1gb", "fast", "-1gbit", "1 gbit", "0gbit", "1tbit",
                                 "1e9", "gbit", "10kbit"])
def test_rejects_with_the_allowed_forms(bad):
    with pytest.raises(GradwireError, match="expected"):
        parse_bandwidth(bad)


@given(st.sampled_from(["mbit", "gbit"]), st.integers(1, 99))
def test_format_round_trips(unit, value):
    text = f"{value}{unit}"
    assert parse_bandwidth(format_bandwidth(parse_bandwidth(text))) == parse_bandwidth(text)
