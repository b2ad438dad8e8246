"""Checks of user input: each returns the value it accepts or raises a one-line
:class:`~gradwire.errors.GradwireError` that names the parameter, the range and what it got."""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from collections.abc import Callable, Hashable
from typing import TypeVar

from gradwire.errors import GradwireError

T = TypeVar("T")

# Bounds of the model sizes and times users hand in (profiles, traces): 2**50 bytes (1 PiB) for a
# whole model, 250 times a trillion-parameter model in fp32 (the simulator's byte and element
# counts, float64 and int64, stay exact far below it; 10**30 overflowed them); 1e6 s (11 days)
# per time, so that sums of them stay finite.
MAX_BYTES = 2**50
MAX_SECONDS = 1e6
# Compute speed-ups (traces, whatif, advise): scaled times stay finite and above zero.
SPEEDUP_RANGE = (1e-6, 1e6)
# Bounds of a cluster's terms (given on the command line, read from a calibration), each far
# beyond any real cluster and low enough that every predicted time stays a finite, printable
# number of seconds:
# - α, per schedule step or message: 1 s (a message around the world and back takes 0.3 s; a
#   cluster's network 5 to 100 µs);
# - γ, per byte reduced: 1 µs, a sum at 1 MB/s (a CPU core sums at GB/s, a GPU hundreds);
# - κ, backward's slowdown beside communication: 100 (measured ones are below 2).
MAX_ALPHA_US = 1e6
MAX_GAMMA_NS = 1e3
MAX_OVERLAP_SLOWDOWN = 100.0
# Iterations a measurement times here (a trace's recording, a profile): each is a forward and
# backward pass, and a simulation replays a few (the paper's steady state shows after two).
MAX_RECORDED = 1000

# Numbers as a person types them: ASCII digits only. Python's int() and float() also take other
# scripts' digits ("١"), underscores ("1_0"), "nan" and "inf"; none of those is a value a
# gradwire option means, so every parser of typed numbers goes through these two.
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def is_int(value: object, low: float = -math.inf, high: float = math.inf) -> bool:
    """Whether ``value`` is an integer (numpy's too; not a bool) in [low, high]."""
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and low <= value <= high)


def is_real(value: object, low: float = -math.inf, high: float = math.inf, *,
            above: bool = False) -> bool:
    """Whether ``value`` is a finite real number (not a bool) ``>= low`` (``> low`` when
    ``above``) and ``<= high``; an integer too large for a float (JSON reads ``1e400`` as inf
    but 1 and 400 zeros as an int) is none, as its float would be inf."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        finite = math.isfinite(value)
    except OverflowError:
        return False
    return finite and (value > low if above else value >= low) and value <= high


# Bounds of the options every run takes (the CLI's and a rank's own).
MAX_SEED = 2**32 - 1
MAX_BATCH = 65536
MAX_SEQ_LEN = 4096
# an mlp epoch on digits takes a second or more: 10,000 are days of training, more a typo
MAX_EPOCHS = 10_000


def check_range(option: str, value: int, low: int, high: int) -> int:
    """An integer option within [low, high] (typer's own min= and max= say less: not the
    value given)."""
    if not is_int(value, low, high):
        raise GradwireError(f"{option} must be from {low} to {high}, got {value}")
    return value


def check_int(name: str, param: str, value: object, low: int) -> int:
    """``value`` if it is an integer (not a bool) ``>= low``."""
    if not is_int(value, low):
        raise GradwireError(f"{name}: {param} must be an integer >= {low}, got {value!r}")
    return value


MAX_POWERSGD_RANK = 1024  # far above any rank PowerSGD is run at (1 to 4 in its paper)


def check_powersgd_rank(rank: int) -> int:
    """``--rank``, PowerSGD's, as every command takes it: an integer from 1 to
    MAX_POWERSGD_RANK."""
    if not is_int(rank, 1, MAX_POWERSGD_RANK):
        raise GradwireError(f"--rank (PowerSGD's) must be from 1 to {MAX_POWERSGD_RANK}, "
                            f"got {rank}")
    return rank


def check_fraction(what: str, value: object) -> float:
    """``value`` as a float if it is a number in (0, 1] (a kept fraction, a share); else a
    one-line error naming ``what`` and echoing the value as typed ("got 2", not "got 2.0")."""
    if not is_real(value, 0, 1, above=True):
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        got = repr(value)
        if number:
            with contextlib.suppress(OverflowError):  # an int too large for "g"'s float
                got = format(value, "g")
        raise GradwireError(f"{what} must be in (0, 1], got {got}")
    return float(value)  # type: ignore[arg-type]


def check_density(density: object, option: str = "--density") -> float:
    """A sparsifier's kept fraction as every command takes it (``option`` names it)."""
    return check_fraction(option, density)


def shown_number(value: float) -> str:
    """``value`` short (``:g``) where that reads back as it, else in full: a value refused
    just past a bound (1000001 against 1e+06) must not read as the bound."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def check_real(what: str, value: object, low: float = 0.0, *, above: bool = False,
               high: float = math.inf) -> float:
    """``value`` as a float if it is a finite real number ``>= low`` (``> low`` when
    ``above``) and ``<= high``; otherwise a one-line error naming ``what`` and the range."""
    if not is_real(value, low, high, above=above):
        bound = f"> {low:g}" if above else f">= {low:g}"
        rng = bound if high == math.inf else f"{bound} and <= {high:g}"
        raise GradwireError(f"{what} must be a finite number {rng}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_speedup(what: str, value: object) -> float:
    """A compute speed-up within :data:`SPEEDUP_RANGE` as a float; otherwise a one-line error
    naming ``what`` (an option, or "compute speed-up")."""
    lo, hi = SPEEDUP_RANGE
    if not is_real(value, lo, hi):
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        raise GradwireError(f"{what} must be a number from {lo:g} to {hi:g}, got {shown}")
    return float(value)  # type: ignore[arg-type]


def parse_int(text: str) -> int | None:
    """``text`` as an integer if it is one written in ASCII digits (an optional sign, no
    spaces inside, at most 4000 digits: int() refuses longer ones); None otherwise."""
    t = text.strip(" \t")
    return int(t) if len(t) <= 4000 and _INT.fullmatch(t) else None


def parse_number(text: str) -> float | None:
    """``text`` as a float if it is a decimal number written in ASCII (``2``, ``-0.5``,
    ``1e-3``); None otherwise, "nan" and "inf" included. A number too large for a float comes
    back as inf, for the caller's range check to refuse."""
    t = text.strip(" \t")
    return float(t) if _FLOAT.fullmatch(t) else None


def number_text(text: str, whole: bool = False) -> bool:
    """Whether ``text`` is a number as a person types it (:func:`parse_int`'s when ``whole``,
    else :func:`parse_number`'s or "inf" and "nan" spelled out, which the option's own range
    check then refuses naming its range): for the command line's number options, which
    int() and float() alone would also read from "1_0" or other scripts' digits."""
    if whole:
        return parse_int(text) is not None
    return (parse_number(text) is not None
            or text.strip(" \t").lower().lstrip("+-") in ("inf", "infinity", "nan"))


def comma_items(text: str) -> list[str]:
    """The items of the comma list ``text``, stripped; an empty item (``a,b,``, ``a,,b``) is
    none, as every CLI list takes it."""
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_numbers(option: str, text: str, low: float = 0.0) -> list[float]:
    """``option``'s comma list ``text`` as floats, each finite and above ``low``; any other
    value is a one-line error naming it. An empty item (``1,2,``) is none, as the CLI's
    lists of names take it."""
    out = []
    parts = comma_items(text)
    if not parts:
        raise GradwireError(f"{option} {text!r} names no number: expected a comma list of "
                            f"numbers > {low:g}")
    for part in parts:
        if not number_text(part):
            raise GradwireError(f"{option} {text!r}: {part!r} is not a number (ASCII digits)")
        v = parse_number(part)
        if v is None or not low < v < math.inf:
            raise GradwireError(f"{option} {text!r}: each value must be a finite number > "
                                f"{low:g}, got {part}")
        out.append(v)
    return out


def distinct(values: list[T], key: Callable[[T], Hashable] | None = None) -> list[T]:
    """``values`` without repeats (by ``key``, default the value itself), first seen first:
    a list option's value named twice is one (one run, one row or column of a table, one
    key of the JSON), as every command takes its lists."""
    seen: dict[object, T] = {}
    for v in values:
        seen.setdefault(v if key is None else key(v), v)
    return list(seen.values())
