"""The one table of algorithms. The API, the CLI, benchmarks and parametrized tests iterate it,
so an algorithm added here is executed, costed, checked and benchmarked with no other change."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Sequence

from gradwire.check import MAX_BYTES, is_int, is_real, parse_int, parse_number
from gradwire.errors import GradwireError, did_you_mean
from gradwire.schedules import (
    binomial,
    bruck,
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
MODULES = (ring, binomial, butterfly, bruck, rhd, master, lp, scatter_allgather, dbtree, ps)
ALGORITHMS: tuple[Algorithm, ...] = tuple(a for m in MODULES for a in m.ALGORITHMS)

# The most ranks a schedule is built for: a ring there has 2·4095·4096 = 33.5 M transfers,
# which the model and the simulator cost in tens of seconds. Beyond it they would take hours
# and tens of GiB, so both refuse it. No schedule has more transfers (ir.MAX_TRANSFERS).
MAX_WORLD = 4096

DEFAULTS = {"allreduce": "ring", "reducescatter": "ring", "allgather": "ring",
            "broadcast": "binomial", "reduce": "binomial"}


def algorithms(collective: str | None = None) -> list[Algorithm]:
    return [a for a in ALGORITHMS if collective is None or a.collective == collective]


def get(collective: str, name: str | None = None) -> Algorithm:
    """The algorithm ``name`` of ``collective`` (its default when ``name`` is None)."""
    if collective not in COLLECTIVES:
        raise GradwireError(f"unknown collective {collective!r}: expected one of "
                            f"{', '.join(COLLECTIVES)}")
    if name is None:  # only None means the default: "" names no algorithm
        name = DEFAULTS.get(collective)
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
    p, count = _world_and_count(p, count)
    if not is_int(root, 0, p - 1):
        raise GradwireError(f"root must be a rank in 0..{p - 1}, got {root!r}")
    root = int(root)
    a = get(collective, name)
    check_params(a, params)
    return _cached(collective, a.name, p, count, root, _key(params))


def _world_and_count(p: object, count: object) -> tuple[int, int]:
    """``p`` and ``count`` as ints, or a one-line error: a float count would cut blocks that
    run past the buffer's end (10.5 elements over 4 ranks made 11)."""
    if not is_int(p, 1, MAX_WORLD):
        raise GradwireError(f"world size must be from 1 to {MAX_WORLD}, got {p!r}")
    if not is_int(count, 0):
        raise GradwireError(f"element count must be an integer >= 0, got {count!r}")
    if count > MAX_BYTES:  # type: ignore[operator]
        # a buffer past what gradwire models anywhere (2**50 bytes), so that counts in bytes
        # stay within int64 and numpy's arithmetic
        raise GradwireError(f"element count must be at most {MAX_BYTES} (2**50), got {count}")
    return int(p), int(count)  # type: ignore[call-overload]


# Given to every builder; those that do not need them ignore them, but an op other than "sum"
# is refused by a builder that does not take op (check_params): it would sum instead.
COMMON = ("itemsize", "op")


@functools.cache
def parameters(a: Algorithm) -> tuple[str, ...]:
    """The parameters ``a``'s builder takes besides P, the count, the root and :data:`COMMON`
    (cached: every collective call checks its parameters against them)."""
    sig = inspect.signature(a.build).parameters.values()
    return tuple(x.name for x in sig if x.kind in (x.POSITIONAL_OR_KEYWORD, x.KEYWORD_ONLY)
                 and x.name not in ("p", "count", "root", *COMMON))


@functools.cache
def takes_op(a: Algorithm) -> bool:
    """Whether ``a``'s builder takes ``op`` (a combine other than the sum, e.g. gTop-k's
    merge); the others ignore it and sum."""
    return "op" in inspect.signature(a.build).parameters


def check_params(a: Algorithm, params: dict[str, object]) -> None:
    """A parameter ``a`` does not take is a one-line error (a typo would otherwise be
    silently ignored), and so is a value of the wrong kind for the builder's annotation
    (``pipeline='abc'``, ``alpha=nan``): the builders check ranges (``pipeline >= 1``),
    this checks kinds, so that ``gradwire bench`` can refuse both before any rank starts.
    ``itemsize``, which every builder is given, must be an integer from 1 to 2**50 (the ring
    picks its sub-chunks by bytes). ``op`` other than "sum" needs a builder that takes it
    (:func:`takes_op`): the others sum, which is no merge of gTop-k's packed bytes."""
    known = parameters(a)
    kinds = _kinds(a)
    op = params.get("op", "sum")
    if not takes_op(a) and not (isinstance(op, str) and op == "sum"):  # it would sum anyway
        takers = [b.name for b in algorithms(a.collective) if takes_op(b)]
        raise GradwireError(f"{a.collective} {a.name} combines by sum only: op={op!r} needs "
                            f"an algorithm that takes op: "
                            f"{', '.join(takers) or f'no {a.collective} algorithm does'}")
    if "itemsize" in params and not is_int(params["itemsize"], 1, MAX_BYTES):
        # at most a buffer's bytes: LP's b* takes count·itemsize as a float, which
        # itemsize=10**400 was not (an OverflowError)
        raise GradwireError(f"{a.collective} {a.name}: parameter itemsize="
                            f"{params['itemsize']!r}: expected an integer >= 1 (bytes per "
                            f"element) and at most {MAX_BYTES} (2**50)")
    for k, v in params.items():
        if k not in known and k not in COMMON:
            raise GradwireError(f"{a.collective} {a.name} has no parameter {k!r}"
                                f"{did_you_mean(k, known)}: it takes "
                                f"{', '.join(known) or 'none'}")
        if k in kinds and not _is_kind(v, kinds[k]):
            raise GradwireError(f"{a.collective} {a.name}: parameter {k}={v!r}: expected "
                                f"{_KIND_TEXT[kinds[k][0]]}")


# What a builder's annotation asks of a value (None is allowed where the annotation has it).
_KIND_TEXT = {int: "an integer", float: "a finite number", str: "a string",
              Sequence: "a list of integers"}


@functools.cache
def _kinds(a: Algorithm) -> dict[str, tuple[type, bool]]:
    """Each parameter's kind (int, float, str or Sequence, and whether None is allowed),
    read from the builder's annotations; parameters annotated otherwise are left out."""
    hints = typing.get_type_hints(a.build)
    out = {}
    for k in parameters(a):
        args = typing.get_args(hints.get(k)) or (hints.get(k),)
        optional = type(None) in args
        for kind in _KIND_TEXT:
            if any(x is kind or typing.get_origin(x) is kind for x in args):
                out[k] = (kind, optional)
                break
    return out


def _is_kind(value: object, kind: tuple[type, bool]) -> bool:
    t, optional = kind
    if value is None:
        return optional
    if t is int:
        return is_int(value)
    if t is float:
        return is_real(value)
    if t is str:
        return isinstance(value, str)
    return isinstance(value, (list, tuple)) and all(is_int(x) for x in value)


def _key(params: dict[str, object]) -> tuple[tuple[str, object], ...]:
    """``params`` as a cache key: lists (a natural way to pass tensor sizes) become tuples,
    and numpy's integers Python's (a builder's arithmetic on an np.int32 block or an np.uint8
    itemsize wrapped or overflowed: block=np.int32(200000) of 10**9 elements was refused as
    too many blocks); anything else that cannot be hashed is a one-line error."""
    out = []
    for k, v in sorted(params.items()):
        if isinstance(v, (list, tuple)):
            v = tuple(int(x) if is_int(x) else x for x in v)
        elif is_int(v):
            v = int(v)  # type: ignore[call-overload]
        try:
            hash(v)
        except TypeError:
            raise GradwireError(f"schedule parameter {k}={v!r}: expected a number, a string or "
                                "a list of numbers") from None
        out.append((k, v))
    return tuple(out)


def _table(collective: str, name: str, p: int, count: int,
           params: tuple[tuple[str, object], ...], cached: bool = False) -> Table:
    a = get(collective, name)
    if a.table is not None:
        return a.table(p, count, **dict(params))
    build = _cached if cached else _cached.__wrapped__
    return Table.of(build(collective, name, p, count, 0, params))


@functools.lru_cache(maxsize=64)
def _cached_table(collective: str, name: str, p: int, count: int,
                  params: tuple[tuple[str, object], ...]) -> Table:
    return _table(collective, name, p, count, params, cached=True)


def table(collective: str, name: str | None, p: int, count: int, *, cached: bool = True,
          **params: object) -> Table:
    """The transfers of ``schedule(collective, name, p, count, **params)`` as arrays, built
    without Transfer objects when the algorithm has a table builder (the ring: 2 M transfers
    at P = 1024). ``cached=False``: built afresh and not kept (for callers that keep what
    they derive from it instead)."""
    p, count = _world_and_count(p, count)
    a = get(collective, name)
    check_params(a, params)
    if cached:
        return _cached_table(collective, a.name, p, count, _key(params))
    return _table(collective, a.name, p, count, _key(params))


def parse_value(text: str) -> object:
    """A parameter's value as written: an int, else a float (ASCII digits only: see
    :func:`gradwire.check.parse_number`), else the text."""
    n = parse_int(text)
    if n is not None:
        return n
    x = parse_number(text)
    return text if x is None else x


def parse_params(items: list[str], what: str = "--param") -> dict[str, object]:
    """``["block=65536", "pipeline=4"]`` → ``{"block": 65536, "pipeline": 4}``."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier() or not value:
            raise GradwireError(f"{what} {item!r} is not valid: expected KEY=VALUE, e.g. "
                                "block=65536 or pipeline=4")
        if key in out:  # which one was meant cannot be told
            raise GradwireError(f"{what} {item!r}: {key} is given twice")
        out[key] = parse_value(value)
    return out
