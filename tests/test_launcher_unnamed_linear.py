"""launcher.unnamed_timeout reads a line once: UNNAMED_TIMEOUT's search scanned from each
"timed out after T s: a rank" to the next ";", so a long line of many such before a ";" that
was not the marker (or before none, the marker earlier in the line) took time that grew with
the square of its length, while the reader thread held the rank's pipe (0.14 s at 64 kB,
about 20 s at 1 MB). It still finds what that search finds."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.launcher import UNNAMED, UNNAMED_TIMEOUT, unnamed_timeout

HEAD = ": x timed out after 1 s: a rank "
LONG = 1 << 20


def _bounded(line: str, limit_s: float = 5.0) -> int | None:
    """unnamed_timeout(line), failing where it took over ``limit_s`` (the old scan took
    about 20 s on these lines, the new one milliseconds). Timed, not run in a thread: the
    regex engine holds the GIL, so a thread's join could not return before it did."""
    t0 = time.monotonic()
    found = unnamed_timeout(line)
    took = time.monotonic() - t0
    assert took < limit_s, f"unnamed_timeout took {took:.1f} s on {len(line)} characters"
    return found


def test_many_timeouts_before_a_semicolon_that_is_not_the_marker_are_read_once():
    line = "rank 0" + HEAD * (LONG // len(HEAD)) + "; not this one" + UNNAMED
    assert _bounded(line) is None


def test_many_timeouts_after_the_marker_and_no_semicolon_are_read_once():
    line = "rank 0 said" + UNNAMED + HEAD * (LONG // len(HEAD))
    assert _bounded(line) is None


def test_a_real_error_at_the_end_of_a_long_line_is_still_read():
    error = ("rank 2 in the epoch's sums after epoch 1: all_reduce timed out after 5 s: a rank "
             "stalled or its link is down" + UNNAMED)
    assert _bounded(HEAD * (LONG // len(HEAD)) + "; " + error) == 2
    assert _bounded("rank 7 " * (LONG // 7) + error) == 7


# Pieces the search turns on, so that short texts of them hold matches, near misses, several
# "rank N", heads whose next ";" is or is not the marker, and newlines between.
PIECES = st.sampled_from([
    "rank 1", "rank 23", "rank", " ", "x", "1", ":", ": ", ";", "\n", "a rank ", " s: ",
    ": all_reduce timed out after 5 s: a rank ", ": x timed out after 1e+06 s: a rank ",
    " timed out after ", "stalled", UNNAMED, "; gloo", "rank 4x", "rank 5;",
])


ERROR = "rank 3 in the start of epoch 2: barrier timed out after 5 s: a rank stalled" + UNNAMED


@st.composite
def _texts(draw) -> str:
    """Pieces, and half the time a whole error among them."""
    pieces = draw(st.lists(PIECES, max_size=14))
    if draw(st.booleans()):
        pieces.insert(draw(st.integers(0, len(pieces))), ERROR)
    return "".join(pieces)


@settings(max_examples=600, deadline=None)
@given(_texts())
def test_it_finds_what_the_search_finds(text):
    m = UNNAMED_TIMEOUT.search(text)
    assert unnamed_timeout(text) == (None if m is None else int(m[1]))
