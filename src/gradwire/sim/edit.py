"""``gradwire trace``: a compute trace recorded from a model or read from a file, edited
(compute sped up, layers added, parameters resized, in that order) and saved."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable
from gradwire.sim import trace as tr


def make_trace(out: Path, model: str | None, source: Path | None, *, iterations: int = 3,
               batch_size: int = 32, seed: int = 0, compute_speedup: float = 1.0,
               add_layers: int = 0, layer: tuple[int, float, float] = (4 * 2**20, 1e-3, 2e-3),
               resize: Sequence[str] = ()) -> tr.Trace:
    """The trace of ``model`` recorded here (``iterations`` kept, ``batch_size`` samples,
    ``seed``) or the one in ``source`` (exactly one of them), with every compute time divided
    by ``compute_speedup``, ``add_layers`` layers of ``layer`` = (bytes, forward s, backward
    s) inserted before the last parameter, and each ``NAME=BYTES`` of ``resize`` applied;
    saved to ``out``, which is checked before anything is recorded."""
    if (model is None) == (source is None):
        raise GradwireError("give exactly one of --model (record) and --from (edit)")
    check_writable(out, "--out")
    if model is not None:
        from gradwire.sim.record import record  # torch: only to record

        t = record(model, iterations, batch_size, seed=seed)
    else:
        t = tr.load(source)  # type: ignore[arg-type]
    if compute_speedup != 1.0:
        t = tr.scale_compute(t, compute_speedup)
    if add_layers:
        t = tr.add_layers(t, add_layers, *layer)
    for item in resize:
        name, sep, value = item.rpartition("=")
        if not sep or not value.isdigit():
            raise GradwireError(f"--resize {item!r}: expected NAME=BYTES")
        t = tr.resize(t, name, int(value))
    tr.save(t, out)
    return t
