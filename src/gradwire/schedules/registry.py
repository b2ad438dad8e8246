"""The one table of algorithms. The API, the CLI, benchmarks and parametrized tests iterate it,
so an algorithm added here is executed, costed, checked and benchmarked with no other change."""

from __future__ import annotations

import functools
import numbers

from gradwire.errors import GradwireError, did_you_mean
from gradwire.schedules import (
    binomial,
    butterfly,
    dbtree,
    lp,
    master,
    ps,
    rhd,
    ring,
    scatter_allgather,
)
from gradwire.schedules.ir import COLLECTIVES, Algorithm, Schedule, Table

# One module per algorithm family; each declares its entries as ALGORITHMS.
MODULES = (ring, binomial, butterfly, rhd, master, lp, scatter_allgather, dbtree, ps)
ALGORITHMS: tuple[Algorithm, ...] = tuple(a for m in MODULES for a in m.ALGORITHMS)

DEFAULTS = {"allreduce": "ring", "reducescatter": "ring", "allgather": "ring",
            "broadcast": "binomial", "reduce": "binomial"}


def algorithms(collective: str | None = None) -> list[Algorithm]:
    return [a for a in ALGORITHMS if collective is None or a.collective == collective]


def get(collective: str, name: str | None = None) -> Algorithm:
    """The algorithm ``name`` of ``collective`` (its default when ``name`` is None)."""
    if collective not in COLLECTIVES:
        raise GradwireError(f"unknown collective {collective!r}: expected one of "
                            f"{', '.join(COLLECTIVES)}")
    name = name or DEFAULTS.get(collective)
    known = [a.name for a in algorithms(collective)]
    for a in algorithms(collective):
        if a.name == name:
            return a
    raise GradwireError(f"unknown {collective} algorithm {name!r}{did_you_mean(name, known)}: "
                        f"expected one of "
                        f"{', '.join(known) or 'none yet'}")


@functools.lru_cache(maxsize=256)
def _cached(collective: str, name: str, p: int, count: int, root: int,
            params: tuple[tuple[str, object], ...]) -> Schedule:
    a = get(collective, name)
    return a.build(p, count, root=root, **dict(params))


def schedule(collective: str, name: str | None, p: int, count: int, root: int = 0,
             **params: object) -> Schedule:
    """Build (or reuse) the schedule of ``name`` for ``p`` ranks and ``count`` elements."""
    if p < 1:
        raise GradwireError(f"world size must be >= 1, got {p}")
    if count < 0:
        raise GradwireError(f"element count must be >= 0, got {count}")
    if isinstance(root, bool) or not isinstance(root, numbers.Integral) or not 0 <= root < p:
        raise GradwireError(f"root must be a rank in 0..{p - 1}, got {root!r}")
    root = int(root)
    a = get(collective, name)
    return _cached(collective, a.name, p, count, root, _key(params))


def _key(params: dict[str, object]) -> tuple[tuple[str, object], ...]:
    """``params`` as a cache key: lists (a natural way to pass tensor sizes) become tuples;
    anything else that cannot be hashed is a one-line error."""
    out = []
    for k, v in sorted(params.items()):
        if isinstance(v, list):
            v = tuple(v)
        try:
            hash(v)
        except TypeError:
            raise GradwireError(f"schedule parameter {k}={v!r}: expected a number, a string or "
                                "a list of numbers") from None
        out.append((k, v))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _cached_table(collective: str, name: str, p: int, count: int,
                  params: tuple[tuple[str, object], ...]) -> Table:
    a = get(collective, name)
    if a.table is not None:
        return a.table(p, count, **dict(params))
    return Table.of(_cached(collective, name, p, count, 0, params))


def table(collective: str, name: str | None, p: int, count: int, **params: object) -> Table:
    """The transfers of ``schedule(collective, name, p, count, **params)`` as arrays, built
    without Transfer objects when the algorithm has a table builder (the ring: 2 M transfers
    at P = 1024)."""
    if p < 1 or count < 0:
        raise GradwireError(f"a table needs p >= 1 and count >= 0, got p={p}, count={count}")
    return _cached_table(collective, get(collective, name).name, p, count, _key(params))
