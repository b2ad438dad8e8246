"""Communication time of any collective from its schedule, fast enough for P = 1024 sweeps.

A schedule's cost (:mod:`gradwire.schedules.cost`) needs, per step, each rank's messages and
bytes out, in and reduced. :func:`summary` reads them from the schedule once and keeps, per
step, only the distinct per-rank rows, and merges steps whose rows are identical (a ring's
2(P−1) steps become one row set with multiplicity 2(P−1)). :func:`seconds` then costs the
summary for any number of (α, β, γ) at once: it is exactly ``cost()`` of the same schedule.

Messages of ``ref_count(P)`` = lcm(P, 2^⌈lg P⌉)·pipeline elements or more reuse the summary
at that count: there the blocks of the algorithms the model uses (ring, recursive doubling
and halving, trees) are all equal and non-empty, so the messages are the same at any larger
count and the bytes grow in proportion to it. Blocks then differ from the schedule built at
the real count by at most one element each, adding at most (β+γ)·itemsize per message:
relative to the α every message pays, about 1e-4 at this cluster's calibration.
``tests/test_perf_model.py`` holds the exact and the scaled case against ``cost()`` for
P = 1…17. An algorithm whose parameters are chosen from the count (the linear pipeline's
block) must be given them explicitly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from itertools import chain

import numpy as np

from gradwire.schedules import registry
from gradwire.schedules.ir import Schedule

_HASH = np.array([1.0, 2.0**-20, np.pi, np.e * 2.0**-20, np.sqrt(2) * 2.0**-21])


@dataclass(frozen=True)
class Summary:
    """``groups``: (steps, rows) pairs; rows[i] = (m_out, b_out, m_in, b_in, b_reduced) of one
    rank in one step, bytes counted in elements of the schedule at ``count`` elements."""

    count: int
    groups: tuple[tuple[int, np.ndarray], ...]


def summarise(s: Schedule) -> Summary:
    p = s.world_size
    seen: dict[bytes, list] = {}
    for step in s.steps:
        ts = step.transfers
        flat = chain.from_iterable((x.src, x.dst, x.count, x.reduces) for x in ts)
        t = np.fromiter(flat, np.int64, 4 * len(ts)).reshape(-1, 4)
        src, dst, n, red = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
        rows = np.stack([np.bincount(src, minlength=p), np.bincount(src, n, p),
                         np.bincount(dst, minlength=p), np.bincount(dst, n, p),
                         np.bincount(dst, n * red, p)], axis=1).astype(float)
        # Most steps treat every rank alike; the others are deduplicated on a hash of each
        # row (a 1-D unique is much cheaper than np.unique(axis=0) at P = 1024).
        if (rows == rows[0]).all():
            rows = rows[:1]
        else:
            _, first = np.unique(rows @ _HASH, return_index=True)
            rows = rows[first]
        key = rows.tobytes()
        if key in seen:
            seen[key][0] += 1
        else:
            seen[key] = [1, rows]
    return Summary(s.count, tuple((m, r) for m, r in seen.values()))


def ref_count(p: int, pipeline: object = 1) -> int:
    """Elements from which summaries are scaled rather than built (see the module docstring)."""
    return math.lcm(p, 1 << (p - 1).bit_length()) * (pipeline if isinstance(pipeline, int) else 1)


@functools.lru_cache(maxsize=512)
def _summary(collective: str, algo: str, p: int, count: int,
             params: tuple[tuple[str, object], ...]) -> Summary:
    return summarise(registry.schedule(collective, algo, p, count, **dict(params)))


def summary(collective: str, algo: str, p: int, count: int, **params: object) -> Summary:
    """The summary of ``registry.schedule(collective, algo, p, count, **params)`` (cached; a
    count above ``ref_count(p)`` reuses that count's summary)."""
    key = tuple(sorted(params.items()))
    return _summary(collective, algo, p, min(count, ref_count(p, params.get("pipeline"))), key)


def seconds(collective: str, algo: str, p: int, count: int, elem_bytes: float,
            alpha: np.ndarray | float, beta: np.ndarray | float, gamma: np.ndarray | float = 0.0,
            **params: object) -> np.ndarray:
    """Predicted seconds of the collective on ``count`` elements of ``elem_bytes`` bytes, for
    each (α, β, γ) given (arrays broadcast): ``cost()`` of its schedule."""
    if p == 1 or count == 0:
        return np.zeros(np.broadcast(alpha, beta, gamma).shape)
    s = summary(collective, algo, p, count, **params)
    scale = elem_bytes * count / s.count
    a, b, g = (np.asarray(v, dtype=float)[..., None] for v in (alpha, beta, gamma))
    total = 0.0
    for steps, rows in s.groups:
        out = a * rows[:, 0] + b * scale * rows[:, 1]
        inn = a * rows[:, 2] + b * scale * rows[:, 3]
        total = total + steps * (np.maximum(out, inn) + g * scale * rows[:, 4]).max(axis=-1)
    return np.asarray(total)
