"""Compute traces: what a worker's forward and backward passes look like, network-agnostic.

A trace says, for every parameter (in the order the forward pass consumes them), its size, and
for each recorded (worker, iteration): when, relative to the start of the forward pass, the
forward pass first uses the parameter, and when, relative to the start of the backward pass,
its gradient is ready. The simulator replays these times and lets the network decide the rest
(the network-operator paper, §5: "network agnostic ... relative to the first event").

The file is JSON lines (``docs/simulator.md``)::

    {"format": "gradwire-trace", "version": 1, "model": "resnet50", "source": "..."}
    {"param": 0, "name": "conv1.weight", "bytes": 1728}
    ...
    {"worker": 0, "iteration": 0, "forward_s": 0.12, "forward": [...], "backward": [...]}

``forward[i]`` and ``backward[i]`` are seconds for parameter ``i``; ``forward_s`` is the whole
forward pass (≥ every forward time); the backward pass ends at the last gradient.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gradwire.check import is_int, is_real
from gradwire.errors import GradwireError, did_you_mean

FORMAT = "gradwire-trace"
VERSION = 1


@dataclass(frozen=True)
class Param:
    name: str
    bytes: int


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


def dumps(t: Trace) -> str:
    head = {"format": FORMAT, "version": VERSION, "model": t.model, "source": t.source, **t.meta}
    lines = [json.dumps(head)]
    lines += [json.dumps({"param": i, "name": p.name, "bytes": p.bytes})
              for i, p in enumerate(t.params)]
    lines += [json.dumps({"worker": it.worker, "iteration": it.iteration,
                          "forward_s": it.forward_s, "forward": list(it.forward),
                          "backward": list(it.backward)}) for it in t.iterations]
    return "\n".join(lines) + "\n"


def save(t: Trace, path: Path) -> Path:
    path.write_text(dumps(t))
    return path


def load(path: Path) -> Trace:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise GradwireError(f"cannot read trace {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise GradwireError(f"cannot read trace {path}: not a text file (a trace is JSON "
                            "lines)") from None
    return loads(text, str(path))


def _bad(where: str, line: int, fld: str, msg: str) -> GradwireError:
    return GradwireError(f"{where}:{line}: field {fld!r}: {msg}")


def _num(where: str, line: int, rec: dict, key: str, lo: float = 0.0) -> float:
    v = rec.get(key)
    if not is_real(v, lo):
        raise _bad(where, line, key, f"expected a finite number >= {lo:g}, got {v!r}")
    return float(v)


def _int(where: str, line: int, rec: dict, key: str, lo: int = 0) -> int:
    v = rec.get(key)
    if not is_int(v, lo):
        raise _bad(where, line, key, f"expected an integer >= {lo}, got {v!r}")
    return v


def _times(where: str, line: int, rec: dict, key: str, n: int) -> tuple[float, ...]:
    v = rec.get(key)
    if not isinstance(v, list) or len(v) != n:
        got = f"a list of {len(v)}" if isinstance(v, list) else repr(v)[:40]
        raise _bad(where, line, key, f"expected a list of {n} times (one per param), got {got}")
    for i, x in enumerate(v):
        if not is_real(x, 0):
            raise _bad(where, line, f"{key}[{i}]", f"expected seconds >= 0, got {x!r}")
    return tuple(float(x) for x in v)


def loads(text: str, where: str = "<trace>") -> Trace:
    """Parse and validate a trace; any defect raises a GradwireError naming line and field."""
    records = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as e:
            raise GradwireError(f"{where}:{n}: not JSON: {e.msg} at column {e.colno}") from None
        except RecursionError:
            raise GradwireError(f"{where}:{n}: JSON nested too deep") from None
        if not isinstance(rec, dict):
            raise GradwireError(f"{where}:{n}: expected a JSON object, got {type(rec).__name__}")
        records.append((n, rec))
    if not records:
        raise GradwireError(f"{where}: empty trace: expected a header line")
    n, head = records[0]
    if head.get("format") != FORMAT:
        raise _bad(where, n, "format", f"expected {FORMAT!r}, got {head.get('format')!r}")
    if head.get("version") != VERSION:
        raise _bad(where, n, "version", f"expected {VERSION} (this gradwire reads version "
                   f"{VERSION}), got {head.get('version')!r}")
    model = head.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(where, n, "model", f"expected a non-empty string, got {model!r}")
    params: list[Param] = []
    its: list[Iteration] = []
    seen: set[tuple[int, int]] = set()
    for n, rec in records[1:]:
        if "param" in rec:
            if its:
                raise _bad(where, n, "param", "parameter lines must come before iteration lines")
            idx = _int(where, n, rec, "param")
            if idx != len(params):
                raise _bad(where, n, "param", f"expected {len(params)} (params are numbered "
                           f"in order from 0), got {idx}")
            name = rec.get("name")
            if not isinstance(name, str) or not name:
                raise _bad(where, n, "name", f"expected a non-empty string, got {name!r}")
            params.append(Param(name, _int(where, n, rec, "bytes", 1)))
        elif "worker" in rec:
            if not params:
                raise GradwireError(f"{where}:{n}: an iteration line before any parameter line "
                                    "(no parameter lines)")
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
    meta = {k: v for k, v in head.items() if k not in ("format", "version", "model", "source")}
    return Trace(model, tuple(params), tuple(its), str(head.get("source", "")), meta)


# ---------------------------------------------------------------- making and editing


def synthetic(model: str, sizes: Sequence[int], forward_s: float, backward_s: float,
              first_backward_s: float = 0.0, names: Sequence[str] | None = None,
              source: str = "synthetic") -> Trace:
    """A one-iteration trace from parameter byte sizes (forward order) and pass times, for
    sources that give no per-layer times: the forward pass spends ``forward_s`` evenly over
    the parameters; the backward pass spends ``first_backward_s`` before the last parameter's
    gradient (the paper's "first layer of backpropagation", Table 3) and the rest of
    ``backward_s`` evenly over the others, ending with parameter 0."""
    n = len(sizes)
    if n == 0 or any(s < 1 for s in sizes):
        raise GradwireError("a synthetic trace needs at least one parameter, each >= 1 byte")
    if first_backward_s > backward_s:
        raise GradwireError(f"the first backward layer ({first_backward_s} s) cannot take "
                            f"longer than the whole backward pass ({backward_s} s)")
    fwd = [forward_s * i / n for i in range(n)]
    step = (backward_s - first_backward_s) / max(n - 1, 1)
    bwd = [first_backward_s + step * (n - 1 - i) for i in range(n)]
    names = list(names) if names is not None else [f"p{i}" for i in range(n)]
    params = tuple(Param(nm, int(s)) for nm, s in zip(names, sizes, strict=True))
    return Trace(model, params, (Iteration(0, 0, forward_s, tuple(fwd), tuple(bwd)),), source)


def scale_compute(t: Trace, speedup: float) -> Trace:
    """Every compute time divided by ``speedup`` (the paper's "faster GPUs", §8.6)."""
    if not speedup > 0:
        raise GradwireError(f"compute speed-up must be > 0, got {speedup}")
    its = tuple(replace(it, forward_s=it.forward_s / speedup,
                        forward=tuple(x / speedup for x in it.forward),
                        backward=tuple(x / speedup for x in it.backward))
                for it in t.iterations)
    return replace(t, iterations=its, source=f"{t.source}; compute /{speedup:g}")


def resize(t: Trace, name: str, nbytes: int) -> Trace:
    """Parameter ``name`` made ``nbytes`` long (compute unchanged)."""
    names = [p.name for p in t.params]
    if name not in names:
        raise GradwireError(f"no parameter {name!r} in the trace{did_you_mean(name, names)}")
    if nbytes < 1:
        raise GradwireError(f"a parameter needs >= 1 byte, got {nbytes}")
    params = tuple(replace(p, bytes=nbytes) if p.name == name else p for p in t.params)
    return replace(t, params=params, source=f"{t.source}; {name} {nbytes} B")


def add_layers(t: Trace, count: int, nbytes: int, forward_s: float, backward_s: float,
               after: int | None = None) -> Trace:
    """``count`` copies of a layer (one parameter of ``nbytes``, ``forward_s`` and
    ``backward_s`` of compute each) inserted after parameter ``after`` in forward order (default:
    before the last parameter, as the paper adds modules inside Inception-v3, §8.5). Compute
    after the insertion point is pushed back accordingly in both passes."""
    n = len(t.params)
    at = (n - 1 if after is None else after + 1)
    if not 0 <= at <= n:
        raise GradwireError(f"after must be a parameter index in 0..{n - 1}, got {after}")
    if count < 0 or nbytes < 1 or forward_s < 0 or backward_s < 0:
        raise GradwireError("add_layers needs count >= 0, bytes >= 1 and times >= 0")
    new = tuple(Param(f"added{j}", nbytes) for j in range(count))
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
    return replace(t, params=params, iterations=tuple(its),
                   source=f"{t.source}; +{count} layers of {nbytes} B")

