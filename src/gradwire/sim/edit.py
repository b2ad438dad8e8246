"""``gradwire trace``: a compute trace recorded from a model or read from a file, edited
(compute sped up, layers added, parameters resized, in that order)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gradwire.check import MAX_RECORDED, check_speedup, is_int, is_real, parse_int
from gradwire.errors import GradwireError
from gradwire.sim import trace as tr


def make_trace(model: str | None, source: Path | None, *, iterations: int = 3,
               batch_size: int = 32, seed: int = 0, compute_speedup: float = 1.0,
               add_layers: int = 0, layer: tuple[int, float, float] = (4 * 2**20, 1e-3, 2e-3),
               resize: Sequence[str] = (),
               on_step: Callable[[int, int], object] | None = None) -> tr.Trace:
    """The trace of ``model`` recorded here (``iterations`` kept, ``batch_size`` samples,
    ``seed``) or the one in ``source`` (exactly one of them), with every compute time divided
    by ``compute_speedup``, ``add_layers`` layers of ``layer`` = (bytes, forward s, backward
    s) inserted before the last parameter, and each ``NAME=BYTES`` of ``resize`` applied.
    Every setting is checked against the trace limits (:data:`gradwire.check.MAX_BYTES`
    and the others) before anything is recorded."""
    if (model is None) == (source is None):
        raise GradwireError("give exactly one of --model (record) and --from (edit)")
    sizes = check_edits(iterations, compute_speedup, add_layers, layer, resize)
    if model is not None:
        from gradwire.sim.record import record  # torch: only to record

        t = record(model, iterations, batch_size, seed=seed, on_step=on_step)
    else:
        t = tr.load(source)  # type: ignore[arg-type]
    if compute_speedup != 1.0:
        t = tr.scale_compute(t, compute_speedup)
    if add_layers:
        t = tr.add_layers(t, add_layers, *layer)
    for name, nbytes in sizes:
        t = tr.resize(t, name, nbytes)
    return t


def check_edits(iterations: int, speedup: float, add_layers: int,
                layer: tuple[int, float, float], resize: Sequence[str]) -> list[tuple[str, int]]:
    """One-line errors for settings no trace could take; ``resize`` as (name, bytes)."""
    if not is_int(iterations, 1, MAX_RECORDED):
        raise GradwireError(f"--iterations must be from 1 to {MAX_RECORDED}, got {iterations}")
    check_speedup("--compute-speedup", speedup)
    if not is_int(add_layers, 0, tr.MAX_PARAMS):
        raise GradwireError(f"--add-layers must be from 0 to {tr.MAX_PARAMS} (the most "
                            f"parameters a trace holds), got {add_layers}")
    nbytes, forward_s, backward_s = layer
    if not is_int(nbytes, 1, tr.MAX_BYTES):
        raise GradwireError(f"--layer-bytes must be from 1 to 2**50, got {nbytes}")
    for option, seconds in (("--layer-forward-ms", forward_s),
                            ("--layer-backward-ms", backward_s)):
        if not is_real(seconds, 0, tr.MAX_SECONDS):
            raise GradwireError(f"{option} must be a number from 0 to "
                                f"{tr.MAX_SECONDS * 1e3:g}, got {seconds * 1e3:g}")
    # What the layers come to in all, past any trace's limits whatever it holds: refused now,
    # not after a recording of minutes (trace.add_layers checks the rest against the trace).
    if add_layers * nbytes > tr.MAX_BYTES:
        raise GradwireError(f"--add-layers {add_layers} of --layer-bytes {nbytes} come to "
                            f"{add_layers * nbytes} bytes: a trace holds at most 2**50")
    for option, seconds in (("--layer-forward-ms", forward_s),
                            ("--layer-backward-ms", backward_s)):
        if add_layers * seconds > tr.MAX_SECONDS:
            raise GradwireError(f"--add-layers {add_layers} of {option} {seconds * 1e3:g} "
                                f"come to {add_layers * seconds:g} s of compute: a trace's "
                                f"times go up to {tr.MAX_SECONDS:g} s")
    out: list[tuple[str, int]] = []
    for item in resize:
        name, sep, value = item.rpartition("=")
        size = parse_int(value) if sep and name else None
        if size is None or not 1 <= size <= tr.MAX_BYTES:
            raise GradwireError(f"--resize {item!r}: expected NAME=BYTES, BYTES a whole number "
                                "from 1 to 2**50")
        earlier = next((b for n, b in out if n == name), None)
        if earlier is not None:  # which size was meant cannot be told
            raise GradwireError(f"--resize {item!r}: {name} is already resized to {earlier} "
                                "bytes: give each parameter once")
        out.append((name, size))
    return out
