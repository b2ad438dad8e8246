"""Compute traces: what a worker's forward and backward passes look like, network-agnostic.

A trace says, for every parameter (in the order the forward pass consumes them), its size, and
for each recorded (worker, iteration): when, relative to the start of the forward pass, the
forward pass first uses the parameter, and when, relative to the start of the backward pass,
its gradient is ready. The simulator replays these times and lets the network decide the rest
(the network-operator paper, §5: "network agnostic ... relative to the first event").

The file is JSON lines (``docs/simulator.md``)::

    {"format": "gradwire-trace", "version": 1, "model": "resnet50", "source": "..."}
    {"param": 0, "name": "conv1.weight", "bytes": 37632, "shape": [64, 3, 7, 7]}
    ...
    {"worker": 0, "iteration": 0, "forward_s": 0.12, "forward": [...], "backward": [...]}

``forward[i]`` and ``backward[i]`` are seconds for parameter ``i``; ``forward_s`` is the whole
forward pass (≥ every forward time); the backward pass ends at the last gradient.
``shape`` is optional: the tensor's shape, where known (PowerSGD's cost depends on it); the
bytes must be a whole multiple of its element count.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gradwire.check import MAX_BYTES, MAX_SECONDS, check_speedup, is_int, is_real
from gradwire.errors import GradwireError, did_you_mean
from gradwire.jsonfile import dumps as strict_dumps
from gradwire.jsonfile import parse_object, read_text, replace_text, shown
from gradwire.profiles import TRACE_FORMAT, Profile

FORMAT = TRACE_FORMAT  # held by the layer below, whose profile reader names a trace given it
VERSION = 1

# Limits of a trace, read or made: bytes and times as gradwire.check's MAX_BYTES and
# MAX_SECONDS. Parameters: 100,000, a hundred times a 175 B-parameter transformer's ~1,000
# tensors; every one is an event per worker and iteration, and an unbounded --add-layers ran out
# of memory. Speed-up: gradwire.check's SPEEDUP_RANGE.
MAX_PARAMS = 100_000


@dataclass(frozen=True)
class Param:
    """One parameter tensor: its name, its gradient's bytes and, where known, its shape."""

    name: str
    bytes: int
    shape: tuple[int, ...] | None = None


def shape_problem(shape: object, nbytes: int) -> str | None:
    """Why ``shape`` cannot be the shape of a tensor of ``nbytes`` (None: it can)."""
    if not isinstance(shape, (list, tuple)) or not all(is_int(d, 1) for d in shape):
        return f"expected a list of integers >= 1 ([] for a 0-d tensor), got {repr(shape)[:60]}"
    n = 1
    for d in shape:
        n *= d
        if n > nbytes:
            break
    if nbytes % n:
        return (f"{nbytes} bytes are not a whole number of the shape's "
                f"{n if n <= nbytes else 'more than ' + str(nbytes)} elements")
    return None


@dataclass(frozen=True)
class Iteration:
    """One worker's compute in one iteration; times in seconds, indexed by parameter."""

    worker: int
    iteration: int
    forward_s: float
    forward: tuple[float, ...]
    backward: tuple[float, ...]

    @property
    def backward_s(self) -> float:
        return max(self.backward, default=0.0)

    def ready_order(self) -> list[int]:
        """Parameters in the order their gradients become ready (ties: the later layer
        first, as backward visits it first)."""
        b = self.backward
        return sorted(range(len(b)), key=lambda i: (b[i], -i))


@dataclass(frozen=True)
class Trace:
    model: str
    params: tuple[Param, ...]
    iterations: tuple[Iteration, ...]
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.params)

    def backward_order(self) -> list[int]:
        """Parameters in the order their gradients become ready (first iteration)."""
        return self.iterations[0].ready_order()


# ---------------------------------------------------------------- writing and reading

_HEADER = ("format", "version", "model", "source")


def dumps(t: Trace) -> str:
    """``t`` as the JSON lines of a trace file, strict JSON (:func:`gradwire.jsonfile.dumps`):
    a metadata value that is not finite is written as null, never as NaN or Infinity, which
    other JSON readers (and :func:`loads`) refuse. A metadata key that names a header field
    is refused: written, it would replace the field (a ``format`` key made an unreadable
    file) or be lost."""
    clash = sorted(set(t.meta) & set(_HEADER))
    if clash:
        raise GradwireError(f"trace metadata key {clash[0]!r}: expected a key other than "
                            f"{', '.join(_HEADER)} (the header's own fields)")
    head = {"format": FORMAT, "version": VERSION, "model": t.model, "source": t.source, **t.meta}
    lines = [strict_dumps(head)]
    lines += [strict_dumps({"param": i, "name": p.name, "bytes": p.bytes}
                           | ({} if p.shape is None else {"shape": list(p.shape)}))
              for i, p in enumerate(t.params)]
    lines += [strict_dumps({"worker": it.worker, "iteration": it.iteration,
                            "forward_s": it.forward_s, "forward": list(it.forward),
                            "backward": list(it.backward)}) for it in t.iterations]
    return "\n".join(lines) + "\n"


def save(t: Trace, path: Path) -> Path:
    """Write ``t`` to ``path``, replaced whole (:func:`gradwire.jsonfile.replace_text`)."""
    replace_text(path, dumps(t))
    return path


def load(path: Path) -> Trace:
    return loads(read_text(path, f"cannot read trace {path}"), shown(str(path)))


def _not_finite(doc: object) -> float | None:
    """The first float in ``doc`` that is not finite (None: there is none)."""
    todo = [doc]  # a loop, not recursion: JSON may nest as deep as its reader allowed
    while todo:
        v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return v
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return None


def _strict(where: str, line: int, rec: dict, header: bool = False) -> None:
    """Refuse a NaN, Infinity or -Infinity anywhere in a line's record: Python's json reads
    them, JSON has none, other readers refuse them, and a header key that held one was kept
    as metadata and written back. An iteration line's times are left to :func:`_times`,
    which refuses them field by field (and walking them here would cost a second pass); the
    ``header`` line has no times, whatever its keys, so all of it is walked."""
    iteration = not header and "worker" in rec and "param" not in rec
    skip = ("forward", "backward") if iteration else ()
    for k, v in rec.items():
        bad = None if k in skip else _not_finite(v)
        if bad is not None:
            what = ("NaN" if math.isnan(bad) else
                    f"{'-' if bad < 0 else ''}Infinity (or a number too large for a float)")
            raise _bad(where, line, k, f"{what}: a trace holds finite numbers only (strict "
                       "JSON has no NaN or Infinity)")


def _bad(where: str, line: int, fld: str, msg: str) -> GradwireError:
    return GradwireError(f"{where}:{line}: field {fld!r}: {msg}")


def _num(where: str, line: int, rec: dict, key: str) -> float:
    v = rec.get(key)
    if not is_real(v, 0, MAX_SECONDS):
        raise _bad(where, line, key, f"expected seconds from 0 to {MAX_SECONDS:g}, got {v!r}")
    return float(v)


def _int(where: str, line: int, rec: dict, key: str, lo: int = 0, hi: int | None = None,
         hi_text: str = "") -> int:
    v = rec.get(key)
    if hi is None and not is_int(v, lo):
        raise _bad(where, line, key, f"expected an integer >= {lo}, got {v!r}")
    if hi is not None and not is_int(v, lo, hi):
        raise _bad(where, line, key, f"expected an integer from {lo} to {hi}{hi_text}, got "
                   f"{v!r}")
    return v


def _times(where: str, line: int, rec: dict, key: str, n: int) -> tuple[float, ...]:
    v = rec.get(key)
    if not isinstance(v, list) or len(v) != n:
        got = f"a list of {len(v)}" if isinstance(v, list) else repr(v)[:40]
        raise _bad(where, line, key, f"expected a list of {n} times (one per param), got {got}")
    for i, x in enumerate(v):
        if not is_real(x, 0, MAX_SECONDS):
            raise _bad(where, line, f"{key}[{i}]", f"expected seconds from 0 to "
                       f"{MAX_SECONDS:g}, got {x!r}")
    return tuple(float(x) for x in v)


# The fields of a parameter line and of an iteration line: any other key is refused, as a
# misspelt optional field ("shpe") would otherwise be dropped without a word.
_PARAM_FIELDS = ("param", "name", "bytes", "shape")
_ITERATION_FIELDS = ("worker", "iteration", "forward_s", "forward", "backward")


def _unknown_field(where: str, line: int, rec: dict, fields: tuple[str, ...], what: str) -> None:
    """Refuse a key of ``rec`` that is none of ``fields`` (one line naming it)."""
    extra = next((k for k in rec if k not in fields), None)
    if extra is not None:
        raise _bad(where, line, extra, f"not a field of {what} line{did_you_mean(extra, fields)}: "
                   f"expected {', '.join(fields)}")


def _not_a_profile(text: str, where: str) -> None:
    """Raise the one line that says so where ``text`` is a model profile (one JSON object over
    many lines, with its params and pass times), not a trace whose first line is not JSON."""
    try:
        doc = parse_object(text, where)
    except GradwireError:
        return
    if "params" in doc and ("forward_s" in doc or "backward_s" in doc):
        raise GradwireError(f"{where} is a model profile (`gradwire profile`), not a trace: "
                            f"simulate takes it as --model {where}")


def loads(text: str, where: str = "<trace>") -> Trace:
    """Parse and validate a trace; any defect raises a GradwireError naming line and field."""
    records = []
    # Lines end at "\n", "\r\n" or "\r" (never inside a JSON string) and nowhere else: JSON
    # strings may hold U+2028, U+2029 and U+0085 unescaped, where str.splitlines() cut a line.
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        # one object a line, each read as every JSON file gradwire reads (a key given twice,
        # a number too long and nesting too deep refused)
        try:
            rec = parse_object(raw, f"{where}:{n}")
        except GradwireError:
            if not records:
                _not_a_profile(text, where)
            raise
        _strict(where, n, rec, header=not records)
        records.append((n, rec))
    if not records:
        raise GradwireError(f"{where}: empty trace: expected a header line")
    n, head = records[0]
    if head.get("format") != FORMAT:
        _not_a_profile(text, where)  # one written on one line reads as a header
        raise _bad(where, n, "format", f"expected {FORMAT!r}, got {head.get('format')!r}")
    if not is_int(head.get("version"), VERSION, VERSION):  # not true, which == 1
        raise _bad(where, n, "version", f"expected {VERSION} (this gradwire reads version "
                   f"{VERSION}), got {head.get('version')!r}")
    model = head.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(where, n, "model", f"expected a non-empty string, got {model!r}")
    source = head.get("source", "")
    if not isinstance(source, str):  # str() made a null "None", and a list its repr
        raise _bad(where, n, "source", f"expected a string, got {repr(source)[:60]}")
    params: list[Param] = []
    name_line: dict[str, int] = {}  # each name's line: --resize NAME must mean one parameter
    total = 0
    its: list[Iteration] = []
    seen: set[tuple[int, int]] = set()
    for n, rec in records[1:]:
        if "param" in rec:
            if its:
                raise _bad(where, n, "param", "parameter lines must come before iteration lines")
            _unknown_field(where, n, rec, _PARAM_FIELDS, "a parameter")
            idx = _int(where, n, rec, "param")
            if idx != len(params):
                raise _bad(where, n, "param", f"expected {len(params)} (params are numbered "
                           f"in order from 0), got {idx}")
            if idx >= MAX_PARAMS:
                raise _bad(where, n, "param", f"a trace holds at most {MAX_PARAMS} parameters")
            name = rec.get("name")
            if not isinstance(name, str) or not name:
                raise _bad(where, n, "name", f"expected a non-empty string, got {name!r}")
            if name in name_line:
                raise _bad(where, n, "name", f"{name!r} is already the name of the parameter "
                           f"on line {name_line[name]}: names must be unique")
            name_line[name] = n
            nbytes = _int(where, n, rec, "bytes", 1, MAX_BYTES, " (2**50)")
            shape = rec.get("shape")
            if shape is not None:
                problem = shape_problem(shape, nbytes)
                if problem:
                    raise _bad(where, n, "shape", problem)
                shape = tuple(shape)
            params.append(Param(name, nbytes, shape))
            total += params[-1].bytes
            if total > MAX_BYTES:
                raise _bad(where, n, "bytes", f"the parameters come to {total} bytes, more than "
                           "the 2**50 a trace may hold")
        elif "worker" in rec:
            if not params:
                raise GradwireError(f"{where}:{n}: an iteration line before any parameter line "
                                    "(no parameter lines)")
            _unknown_field(where, n, rec, _ITERATION_FIELDS, "an iteration")
            w, i = _int(where, n, rec, "worker"), _int(where, n, rec, "iteration")
            if (w, i) in seen:
                raise _bad(where, n, "iteration", f"worker {w} iteration {i} appears twice")
            seen.add((w, i))
            fwd_s = _num(where, n, rec, "forward_s")
            fwd = _times(where, n, rec, "forward", len(params))
            k = next((j for j in range(1, len(fwd)) if fwd[j] < fwd[j - 1]), 0)
            if k:
                raise _bad(where, n, f"forward[{k}]", f"forward times must not decrease (params "
                           f"are listed in forward order): {fwd[k]} < {fwd[k - 1]}")
            if fwd and fwd[-1] > fwd_s:
                raise _bad(where, n, "forward_s", f"expected >= the last forward time "
                           f"{fwd[-1]}, got {fwd_s}")
            its.append(Iteration(w, i, fwd_s, fwd, _times(where, n, rec, "backward",
                                                          len(params))))
        else:
            raise GradwireError(f"{where}:{n}: expected a 'param' or a 'worker' line, got keys "
                                f"{sorted(rec)[:5]}")
    if not params:
        raise GradwireError(f"{where}: no parameter lines")
    if not its:
        raise GradwireError(f"{where}: no iteration lines")
    meta = {k: v for k, v in head.items() if k not in _HEADER}
    return Trace(model, tuple(params), tuple(its), source, meta)


# ---------------------------------------------------------------- making and editing


def synthetic(model: str, sizes: Sequence[int], forward_s: float, backward_s: float,
              first_backward_s: float = 0.0, names: Sequence[str] | None = None,
              source: str = "synthetic",
              shapes: Sequence[Sequence[int] | None] | None = None,
              backward_layers: Sequence[float] | None = None) -> Trace:
    """A one-iteration trace from parameter byte sizes (forward order) and pass times, for
    sources that give no per-layer times: the forward pass spends ``forward_s`` evenly over
    the parameters; the backward pass spends ``first_backward_s`` before the last parameter's
    gradient (the paper's "first layer of backpropagation", Table 3) and the rest of
    ``backward_s`` evenly over the others, ending with parameter 0. ``shapes``: the tensors'
    shapes, in the same order as ``sizes`` (None where unknown). ``backward_layers``: where
    the backward time of each parameter's layer is known (forward order, summing to
    ``backward_s``), each gradient is ready once its layer and those after it have run."""
    if not isinstance(model, str) or not model:  # as loads() reads it
        raise GradwireError(f"a synthetic trace's model must be a non-empty string, got "
                            f"{model!r}")
    n = len(sizes)
    if n == 0 or any(not is_int(s, 1) for s in sizes):
        raise GradwireError("a synthetic trace needs at least one parameter, each a whole "
                            "number of bytes >= 1")
    # the limits loads() holds a file to: a NaN or infinite time is an event that never comes
    # due, and a simulation waiting on it would not end. Summed as Python ints: numpy's int64
    # sizes wrapped past 2**63 to a negative total that passed the check.
    total = sum(int(s) for s in sizes)
    if n > MAX_PARAMS or total > MAX_BYTES:
        raise GradwireError(f"a synthetic trace holds at most {MAX_PARAMS} parameters and "
                            f"2**50 bytes, got {n} parameters of {total} bytes")
    for what, v in (("forward", forward_s), ("backward", backward_s),
                    ("first backward layer", first_backward_s)):
        if not is_real(v, 0, MAX_SECONDS):
            raise GradwireError(f"a synthetic trace's {what} time must be from 0 to "
                                f"{MAX_SECONDS:g} s, got {v!r}")
    if first_backward_s > backward_s:
        raise GradwireError(f"the first backward layer ({first_backward_s} s) cannot take "
                            f"longer than the whole backward pass ({backward_s} s)")
    fwd = [forward_s * i / n for i in range(n)]
    if backward_layers is not None:
        layers = list(backward_layers)
        if len(layers) != n or not all(is_real(v, 0, MAX_SECONDS) for v in layers):
            raise GradwireError(f"a synthetic trace's backward layers must be {n} times from 0 "
                                f"to {MAX_SECONDS:g} s, one per parameter")
        bwd = list(itertools.accumulate(reversed(layers)))[::-1]
    else:
        step = (backward_s - first_backward_s) / max(n - 1, 1)
        # one parameter is the first layer and the last: its gradient ends the whole pass
        bwd = ([first_backward_s + step * (n - 1 - i) for i in range(n)] if n > 1
               else [backward_s])
    names = list(names) if names is not None else [f"p{i}" for i in range(n)]
    shapes = list(shapes) if shapes is not None else [None] * n
    if len(names) != n or len(shapes) != n:
        raise GradwireError(f"a synthetic trace needs one name and one shape (or None) per "
                            f"parameter: {n} sizes, {len(names)} names, {len(shapes)} shapes")
    bad = next((nm for nm in names if not isinstance(nm, str) or not nm), None)
    if bad is not None:  # as loads() reads a name: else the trace is written but never read
        raise GradwireError(f"a synthetic trace's parameter names must be non-empty strings, "
                            f"got {bad!r}")
    # a dict of the names seen: scanning those before each name took a minute at MAX_PARAMS
    first: dict[str, int] = {}
    for i, nm in enumerate(names):
        if nm in first:
            raise GradwireError(f"a synthetic trace's parameter names must be unique: {nm!r} "
                                f"is given twice (parameters {first[nm]} and {i})")
        first[nm] = i
    for nm, s, shape in zip(names, sizes, shapes, strict=True):
        problem = None if shape is None else shape_problem(shape, int(s))
        if problem:
            raise GradwireError(f"{nm}: shape: {problem}")
    params = tuple(Param(nm, int(s), None if shape is None else tuple(int(d) for d in shape))
                   for nm, s, shape in zip(names, sizes, shapes, strict=True))
    return Trace(model, params, (Iteration(0, 0, forward_s, tuple(fwd), tuple(bwd)),), source)


def profile_tensors(prof: Profile) -> tuple[list[int], list[str], list | None]:
    """``prof``'s tensors in forward order (a profile lists them in backward order): their
    bytes, names and shapes (None where the profile has none)."""
    params = list(reversed(prof.params))
    shapes = None if prof.shapes is None else list(reversed(prof.shapes))
    return [n * prof.itemsize for _, n in params], [nm for nm, _ in params], shapes


def from_profile(prof: Profile, where: str) -> Trace:
    """A one-iteration trace of the model profile ``prof`` (``where``: what it was loaded
    from, for the trace's source): the forward pass spread evenly over the tensors, each
    gradient ready once its layer's backward time and those of the layers after it have
    passed: the profile's measured per-layer times, or its backward time in proportion to the
    tensors' elements where it has none."""
    if not prof.has_compute:
        raise GradwireError(f"{where}: profile {prof.model!r} has no compute times: give "
                            "them (--compute-ms FORWARD,BACKWARD), a profile measured with "
                            "`gradwire profile --model M --out FILE`, or a trace (`gradwire "
                            "trace --model M` records one)")
    assert prof.forward_s is not None and prof.backward_s is not None
    sizes, names, shapes = profile_tensors(prof)
    layers = list(reversed(prof.layer_backward_s()))
    how = ("per layer as measured" if prof.backward_layer_s is not None else
           "spread over the tensors in proportion to their elements (no per-layer times)")
    return synthetic(prof.model, sizes, prof.forward_s, prof.backward_s, names=names,
                     source=f"{where}: forward {prof.forward_s * 1e3:g} ms spread evenly over "
                     f"{len(sizes)} tensors, backward {prof.backward_s * 1e3:g} ms {how}",
                     shapes=shapes, backward_layers=layers)


def scale_compute(t: Trace, speedup: float) -> Trace:
    """Every compute time divided by ``speedup`` (the paper's "faster GPUs", §8.6), which
    must lie in :data:`~gradwire.check.SPEEDUP_RANGE`."""
    check_speedup("compute speed-up", speedup)
    its = tuple(replace(it, forward_s=it.forward_s / speedup,
                        forward=tuple(x / speedup for x in it.forward),
                        backward=tuple(x / speedup for x in it.backward))
                for it in t.iterations)
    return _within_time(replace(t, iterations=its, source=f"{t.source}; compute /{speedup:g}"),
                        f"compute speed-up {speedup:g}")


def resize(t: Trace, name: str, nbytes: int) -> Trace:
    """Parameter ``name`` made ``nbytes`` long (compute unchanged; its shape dropped unless
    ``nbytes`` is its present size)."""
    names = [p.name for p in t.params]
    if name not in names:
        raise GradwireError(f"no parameter {name!r} in the trace{did_you_mean(name, names)}")
    if names.count(name) > 1:  # a Trace made in Python: a file's names are unique (loads)
        raise GradwireError(f"{names.count(name)} parameters are named {name!r}: cannot tell "
                            "which to resize")
    others = sum(p.bytes for p in t.params if p.name != name)
    if not is_int(nbytes, 1, MAX_BYTES - others):
        raise GradwireError(f"{name}: bytes must be from 1 to {MAX_BYTES - others} (a trace "
                            f"holds at most 2**50 bytes), got {nbytes!r}")
    params = tuple(Param(p.name, nbytes) if p.name == name and p.bytes != nbytes else p
                   for p in t.params)
    return replace(t, params=params, source=f"{t.source}; {name} {nbytes} B")


_ADDED = re.compile(r"added([0-9]+)", re.ASCII)  # the names add_layers gives


def add_layers(t: Trace, count: int, nbytes: int, forward_s: float, backward_s: float,
               after: int | None = None) -> Trace:
    """``count`` copies of a layer (one parameter of ``nbytes``, ``forward_s`` and
    ``backward_s`` of compute each) inserted after parameter ``after`` in forward order (default:
    before the last parameter, as the paper adds modules inside Inception-v3, §8.5). Compute
    after the insertion point is pushed back accordingly in both passes. The layers are named
    ``added<N>``, numbered on from the highest such name already in ``t`` (``added0`` on in a
    trace without one), so that layers added twice keep names of their own and
    :func:`resize` can tell them apart."""
    n = len(t.params)
    if after is not None and not is_int(after, 0, n - 1):
        raise GradwireError(f"after must be a parameter index in 0..{n - 1}, got {after!r}")
    at = n - 1 if after is None else after + 1
    if not is_int(count, 0, MAX_PARAMS - n):
        raise GradwireError(f"layers to add must be from 0 to {MAX_PARAMS - n} (a trace holds "
                            f"at most {MAX_PARAMS} parameters, this one has {n}), got {count!r}")
    room = MAX_BYTES - t.total_bytes
    if not is_int(nbytes, 1) or count * nbytes > room:
        raise GradwireError(f"added layers' bytes must be >= 1 and come to at most {room} in "
                            f"all (a trace holds at most 2**50 bytes), got {count} x {nbytes!r}")
    for what, v in (("forward", forward_s), ("backward", backward_s)):
        if not is_real(v, 0, MAX_SECONDS):
            raise GradwireError(f"an added layer's {what} time must be from 0 to "
                                f"{MAX_SECONDS:g} s, got {v!r}")
    first = 1 + max((int(m.group(1)) for p in t.params
                     if (m := _ADDED.fullmatch(p.name)) is not None), default=-1)
    new = tuple(Param(f"added{first + j}", nbytes) for j in range(count))
    params = t.params[:at] + new + t.params[at:]
    its = []
    for it in t.iterations:
        base = it.forward[at] if at < n else it.forward_s
        add_f = tuple(base + j * forward_s for j in range(count))
        fwd = it.forward[:at] + add_f + tuple(x + count * forward_s for x in it.forward[at:])
        # Backward runs in reverse: the new layers' gradients come after those of params >= at,
        # delaying every gradient of params < at.
        cut = max(it.backward[at:], default=0.0)
        add_b = tuple(cut + (count - j) * backward_s for j in range(count))
        bwd = (tuple(x + count * backward_s for x in it.backward[:at]) + add_b
               + it.backward[at:])
        its.append(replace(it, forward_s=it.forward_s + count * forward_s, forward=fwd,
                           backward=bwd))
    return _within_time(replace(t, params=params, iterations=tuple(its),
                                source=f"{t.source}; +{count} layers of {nbytes} B"),
                        f"{count} added layers of {forward_s:g} s + {backward_s:g} s")


def _within_time(t: Trace, edit: str) -> Trace:
    """``t``, made by ``edit``, if its times still fit a trace (:data:`MAX_SECONDS`)."""
    longest = max(max(it.forward_s, it.backward_s) for it in t.iterations)
    if longest > MAX_SECONDS:
        raise GradwireError(f"{edit} would make a pass take {longest:g} s: a trace's times "
                            f"go up to {MAX_SECONDS:g} s")
    return t

