"""Message sizes as nccl-tests users write them: ``1K:64M`` (doubling), ``1K:64M:4`` (×4),
or a comma list ``4M,64M``; suffixes K, M, G are powers of 1024. Digits are ASCII, and a size
is at least 1 byte (what fits in memory is the caller's to check: ``gradwire bench`` does)."""

from __future__ import annotations

import re

from gradwire.check import comma_items, parse_int
from gradwire.errors import GradwireError

_SIZE = re.compile(r"([0-9]+)([KMG]?)B?", re.I | re.ASCII)
_MULT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
FORMS = "a size like 4096, 1K, 64M, a range 1K:64M or 1K:64M:4, or a comma list of them"


def parse_size(text: str) -> int:
    m = _SIZE.fullmatch(text.strip(" \t")) if len(text) < 100 else None
    if not m:
        raise GradwireError(f"size {text!r} is not valid: expected {FORMS}")
    n = int(m.group(1)) * _MULT[m.group(2).upper()]
    if n < 1:
        raise GradwireError(f"size {text!r} is out of range: expected 1 or more")
    return n


def parse_sizes(text: str) -> list[int]:
    """Sizes in bytes, ascending, without duplicates; an empty item (``1K,4M,``) is none, as
    the CLI's lists of names take it."""
    out: set[int] = set()
    parts = comma_items(text)
    if not parts:
        raise GradwireError(f"{text!r} names no size: expected {FORMS}")
    for part in parts:
        fields = part.split(":")
        if len(fields) == 1:
            out.add(parse_size(fields[0]))
            continue
        if len(fields) > 3:
            raise GradwireError(f"size range {part!r} is not valid: expected {FORMS}")
        lo, hi = parse_size(fields[0]), parse_size(fields[1])
        factor = parse_int(fields[2]) if len(fields) == 3 else 2
        if factor is None or factor < 2 or hi < lo:
            raise GradwireError(f"size range {part!r} is not valid: expected LOW:HIGH[:FACTOR] "
                                "with 1 <= LOW <= HIGH and FACTOR >= 2")
        s = lo
        while s <= hi:
            out.add(s)
            s *= factor
    return sorted(out)


def format_size(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)
