"""Every environment override gradwire reads, in one place.

| variable | default | what |
|---|---|---|
| GRADWIRE_HOME | ~/.cache/gradwire | calibrations and other saved state |
| GRADWIRE_STATE_DIR | /run/gradwire | live emulated clusters (one JSON file each) |
| GRADWIRE_TIMEOUT | 60 | seconds (0.001 to 2e6) one send or receive may wait before it fails |
| GRADWIRE_CHECK_CALLS | 1 | 0: skip the header exchange that catches mismatched calls |

A variable that is empty or only whitespace counts as unset: its default applies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gradwire.check import is_real, parse_number
from gradwire.errors import GradwireError


def _read(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """``name``'s value in ``environ`` (this process's environment by default), or ``default``
    where it is unset, empty or only whitespace."""
    raw = (os.environ if environ is None else environ).get(name, "")
    return raw if raw.strip() else default


def _folder(name: str, default: str) -> Path:
    """``name``'s folder with ``~`` expanded; a ``~`` with no home to stand for (``~nobody``,
    or ``~`` where HOME is unset and this user has no passwd entry) is a one-line error, not
    pathlib's RuntimeError traceback."""
    raw = _read(name, default)
    try:
        return Path(raw).expanduser()
    except RuntimeError:
        raise GradwireError(f"{name} {raw!r}: its '~' names no home directory here: give "
                            f"{name} (or HOME) as a full path") from None


def home() -> Path:
    return _folder("GRADWIRE_HOME", "~/.cache/gradwire")


def state_dir() -> Path:
    return _folder("GRADWIRE_STATE_DIR", "/run/gradwire")


# α where nothing better is known: a typical per-message latency between hosts over Ethernet
# (TCP, NCCL's or gloo's socket transport). ``gradwire calibrate`` measures a cluster's own;
# every default α of gradwire (cost, block choice, what-if and advise, the bench report) is
# this one.
DEFAULT_ALPHA_S = 50e-6

# c10d takes a wait's limit in milliseconds as a C int: 2**31 ms is 24.8 days. It truncates a
# shorter limit to whole milliseconds, and 0 ms is its "no timeout": a wait under 1 ms would
# wait for ever.
MAX_TIMEOUT_S = 2_000_000.0
MIN_TIMEOUT_S = 0.001


def valid_timeout(value: object) -> bool:
    """Whether ``value`` can bound a wait: a number of seconds in [MIN_TIMEOUT_S,
    MAX_TIMEOUT_S]."""
    return is_real(value, MIN_TIMEOUT_S, MAX_TIMEOUT_S)


def check_timeout(name: str, value: object, given: object = None) -> float:
    """``value`` as seconds where :func:`valid_timeout` takes it, else the one-line error for
    the limit ``name``, showing ``given`` (what the user typed; default ``value``)."""
    if not valid_timeout(value):
        raise GradwireError(f"{name} must be a number of seconds from {MIN_TIMEOUT_S:g} to "
                            f"{MAX_TIMEOUT_S:g}, got {value if given is None else given!r}")
    return float(value)  # type: ignore[arg-type]


def timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds one point-to-point operation may take before the peer counts as lost
    (``environ``: the environment to read, e.g. the one a launcher gives its ranks)."""
    raw = _read("GRADWIRE_TIMEOUT", "60", environ)
    # ASCII digits: not "1_0", "١٠", "nan" or "inf"
    return check_timeout("GRADWIRE_TIMEOUT", parse_number(raw.strip()), raw)


def check_calls() -> bool:
    """Whether collectives exchange a header first so that mismatched calls fail clearly."""
    raw = _read("GRADWIRE_CHECK_CALLS", "1")
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise GradwireError(f"GRADWIRE_CHECK_CALLS must be 1/true/yes/on or 0/false/no/off, got "
                        f"{raw!r}")
