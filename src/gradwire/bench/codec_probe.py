"""Measuring a codec table (:mod:`gradwire.perf.codecs`) on a device: every method's local
work in a hook, encode and decode, never its communication: the compressor, and for the
methods with error feedback what the hook does around it (the NaN/Inf status, the residual
added and updated, the average written over the bucket)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from gradwire.catalogue import METHODS
from gradwire.catalogue.paths import LOWRANK, SPARSE
from gradwire.compress import Compressor, feedback, majority_vote

VOTE_RANKS = 8


def measure(numel: int = 4_000_000, repeats: int = 3, density: float = 0.001,
            rank: int = 4, device: str | torch.device = "cpu") -> dict:
    """Encode and decode medians of every method on ``numel`` random fp32 elements on
    ``device`` (CUDA synchronized around each timed call), ``repeats`` after one.

    Each method's compressor as the catalogue builds it, with ``density`` where it takes
    one and PowerSGD's ``rank``. encode: compress; decode: decompress of one payload
    (gathered methods do it once per rank). For the vote, its time per rank (``decode_s``)
    and the rest (``decode_fixed_s``) from votes over 1 and ``VOTE_RANKS`` payloads. dense
    has no codec: 0 and 0. A method with error feedback adds the passes its hook makes over
    the bucket (:func:`feedback_passes`).
    """
    dev = torch.device(device)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(dev)
    passes = feedback_passes(x, repeats, dev)
    methods: dict[str, dict] = {"dense": {"params": {}, "encode_s": 0.0, "decode_s": 0.0}}
    for name, m in METHODS.items():
        if m.compressor is None:
            continue
        options = {"rank": rank} if "rank" in m.options else {}
        c = m.make_compressor(density, **options)
        params = {**({"density": density} if m.takes_density else {}), **options}
        enc, dec = [], []
        for _ in range(repeats + 1):
            payload, e = _timed(lambda c=c: c.compress(x), dev)
            _, d = _timed(lambda c=c, p=payload: c.decompress(p, numel), dev)
            enc.append(e)
            dec.append(d)
        row = {"params": params, "encode_s": statistics.median(enc[1:]),
               "decode_s": statistics.median(dec[1:])}
        # the compressor combines the payloads its own way (signSGD's vote), not by
        # decompressing each one
        if type(c).combine is not Compressor.combine:
            one, many = (_median_s(lambda n=n, p=payload: majority_vote([p] * n, numel),
                                   repeats, dev) for n in (1, VOTE_RANKS))
            row["decode_s"] = max(many - one, 0.0) / (VOTE_RANKS - 1)
            row["decode_fixed_s"] = max(one - row["decode_s"], 0.0)
        if m.error_feedback:
            status, add, write = passes["status"], passes["add"], passes["write"]
            if m.path in (SPARSE, LOWRANK):
                # the status, acc = e + x in the residual; then the average over x (sparse:
                # zeroed before the entries go back; low rank: e = acc − x, one more pass)
                row["encode_s"] += status + add
                row["decode_s"] += write if m.path is SPARSE else add
            else:  # ErrorFeedback: the status, g + e, and e = g + e − decompress(payload)
                row["encode_s"] += status + 2 * add + row["decode_s"]
        methods[name] = row
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (
        f"CPU, {torch.get_num_threads()} thread(s)")
    return {"numel": numel, "dtype": "float32", "methods": methods,
            "source": f"measured by gradwire calibrate (each method's local work in a hook, "
                      f"no communication) on {where}: torch {torch.__version__}, median of "
                      f"{repeats}"}


def feedback_passes(x: torch.Tensor, repeats: int, dev: torch.device) -> dict[str, float]:
    """Seconds of the passes over a bucket ``x`` that a hook with error feedback makes
    besides its codec: ``status`` (this rank's NaN/Inf status of x and its residual),
    ``add`` (the residual plus x, in place), ``write`` (the bucket overwritten)."""
    e, out = torch.zeros_like(x), torch.empty_like(x)
    return {"status": _median_s(lambda: feedback.local_status(x, e), repeats, dev),
            "add": _median_s(lambda: e.add_(x), repeats, dev),
            "write": _median_s(lambda: out.zero_(), repeats, dev)}


def _timed(fn: Callable[[], object], dev: torch.device) -> tuple[object, float]:
    """``fn()`` and its seconds, the device idle before and done after."""
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t0


def _median_s(fn: Callable[[], object], repeats: int, dev: torch.device) -> float:
    times = [_timed(fn, dev)[1] for _ in range(repeats + 1)]
    return statistics.median(times[1:])  # the first call warms up


def sync(dev: torch.device) -> None:
    """Wait for everything queued on ``dev`` (nothing to wait for on the CPU)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
