"""Link rates as users write them (``100mbit``, ``1gbit``, ``none``) and as tc wants them."""

from __future__ import annotations

import re
from decimal import Decimal

from gradwire.errors import GradwireError

# Each unit's power of ten: the rate is read as one decimal number ("0.534e9"), rounded once,
# so that a rate is the same float in every unit it is written in (0.534 * 1e9, rounded twice,
# is not 534mbit's float).
_UNITS = {"kbit": 3, "mbit": 6, "gbit": 9, "tbit": 12}
# ASCII only: \d and str.lower() would also take other scripts' digits ("١gbit") and the
# Kelvin sign ("1\u212abit"), which tc and every reader of a result file would not.
# A decimal as the CLI's numbers take it: "2.5", ".5" and "5." alike.
_PATTERN = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(kbit|mbit|gbit|tbit)", re.ASCII)
RATES = "a rate like 100mbit, 1gbit, 2.5gbit, 10gbit, 25gbit (units kbit, mbit, gbit, tbit)"
# What tc shapes and an emulated host can carry; a model prices links inside a GPU node too
# (NVLink: 3.6 Tbit/s on an H100, 14.4 on a B200), up to MODEL_MOST.
TC_MOST = 4e11
MODEL_MOST = 1e14
# The words taken for an unshaped link, where a caller offers one; its errors list them all.
UNSHAPED = ("none", "unlimited")
ALLOWED = f"{RATES}, or {' or '.join(UNSHAPED)} (an unshaped link)"


def parse_bandwidth(text: str, unshaped: bool = True, most: float = TC_MOST) -> float | None:
    """Return the rate in bits per second, or None for an unshaped link (``none`` or
    ``unlimited``), which ``unshaped=False`` (a model or simulator that needs a rate) does not
    offer; ``most``: the fastest rate taken (what tc shapes, unless a model passes
    :data:`MODEL_MOST`). An invalid rate's error lists the forms taken in that context.

    >>> parse_bandwidth("1gbit")
    1000000000.0
    """
    s = text.strip().lower()
    if s in UNSHAPED and unshaped:
        return None
    m = _PATTERN.fullmatch(s) if text.isascii() else None
    if not m:
        raise GradwireError(f"bandwidth {text!r} is not valid: expected "
                            f"{ALLOWED if unshaped else RATES}")
    bps = float(f"{m.group(1)}e{_UNITS[m.group(2)]}")
    if not 1e5 <= bps <= most:
        raise GradwireError(f"bandwidth {text!r} is out of range: expected 100kbit to "
                            f"{format_bandwidth(most)}")
    return bps


def format_bandwidth(bps: float | None) -> str:
    """Inverse of :func:`parse_bandwidth` for display: 1e9 -> '1gbit', None -> 'none'."""
    if bps is None:
        return "none"
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            short = f"{bps / scale:g}"
            if float(Decimal(short).scaleb(_UNITS[unit])) == bps:  # as parse_bandwidth reads it
                return f"{short}{unit}"
            # more digits than "g"'s six: the rate's own shortest decimal, its point moved
            # (exact: a rate that differs prints differently, as whatif's columns need)
            digits = format(Decimal(repr(float(bps))).scaleb(-_UNITS[unit]).normalize(), "f")
            return f"{digits}{unit}"
    return f"{bps:g}bit"
