"""Measuring a codec table (:mod:`gradwire.perf.codecs`) on a device: every method's local
work in a hook, encode and decode, never its communication: the compressor, and for the
methods with error feedback what the hook does around it (the NaN/Inf status, the residual
added and updated, the average written over the bucket).

Every timed call finds the device's last-level cache flushed first (:class:`Flush`), as a
training iteration finds a bucket and its residual: between two aggregations of a bucket,
forward, backward and the optimizer stream the model's weights, gradients and activations
through the cache. A call timed over and over on the same hot tensors measures a speed the
hook never sees: a bucket that fits in the cache takes a fraction of its time from memory."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gradwire.catalogue import METHODS
from gradwire.catalogue.paths import LOWRANK, SPARSE, SUMMED
from gradwire.collectives.local import execute_local
from gradwire.compress import Compressor, feedback, majority_vote
from gradwire.compress.base import select_count
from gradwire.sparse import allreduce as sparse
from gradwire.sparse.allreduce import Plan

VOTE_RANKS = 8
CPU_CACHE_BYTES = 32 * 2**20  # where the CPU's last-level cache cannot be read from sysfs
CUDA_L2_BYTES = 128 * 2**20  # where the device does not report its L2 size


def measure(numel: int = 4_000_000, repeats: int = 3, density: float = 0.001,
            rank: int = 4, device: str | torch.device = "cpu") -> dict:
    """Encode and decode medians of every method on ``numel`` random fp32 elements on
    ``device`` (CUDA synchronized around each timed call), ``repeats`` after one.

    Each method's compressor as the catalogue builds it, with ``density`` where it takes
    one and PowerSGD's ``rank``. encode: compress; decode: decompress of one payload
    (gathered methods do it once per rank; the summed ones write into the bucket, as their
    hook does). For the vote, its time per rank (``decode_s``) and the rest
    (``decode_fixed_s``) from votes over 1 and ``VOTE_RANKS`` payloads; for the sparse
    aggregations, what their hook does with the entries it receives (:func:`sparse_decode`).
    dense has no codec: 0 and 0. A method with error feedback adds the passes its hook makes
    over the bucket (:func:`feedback_passes`).
    """
    dev = torch.device(device)
    x = gradient(numel, 0, dev)
    flush = Flush(dev)
    passes = feedback_passes(x, repeats, dev, flush)
    out = torch.empty_like(x)
    methods: dict[str, dict] = {"dense": {"params": {}, "encode_s": 0.0, "decode_s": 0.0}}
    for name, m in METHODS.items():
        if m.compressor is None:
            continue
        options = {"rank": rank} if "rank" in m.options else {}
        c = m.make_compressor(density, **options)
        params = {**({"density": density} if m.takes_density else {}), **options}
        # the compressor combines the payloads its own way (signSGD's vote), not by
        # decompressing each one
        votes = type(c).combine is not Compressor.combine
        enc, dec = [], []
        for cold in _colds(flush, repeats):
            # the payload of the step before is gone when a hook compresses (a second one
            # alive costs a fresh allocation's page faults, with huge pages many times the
            # compress itself)
            payload = None
            payload, e = _timed(lambda c=c: c.compress(x), dev, cold)
            enc.append(e)
            if m.path is SPARSE or votes:  # their hooks never decompress one payload
                continue
            if m.path is SUMMED:  # the hook writes the sum straight into the bucket
                _, d = _timed(lambda c=c, p=payload: c.decompress_into(p, out), dev, cold)
            else:
                _, d = _timed(lambda c=c, p=payload: c.decompress(p, numel), dev, cold)
            dec.append(d)
        row = {"params": params, "encode_s": statistics.median(enc[1:])}
        if m.path is SPARSE:  # what the hook does with the entries it receives
            row.update(sparse_decode(name, x, select_count(numel, density, None), repeats, dev,
                                     flush))
        elif votes:
            one, many = (_median_s(lambda n=n, p=payload: majority_vote([p] * n, numel),
                                   repeats, dev, flush) for n in (1, VOTE_RANKS))
            row["decode_s"] = max(many - one, 0.0) / (VOTE_RANKS - 1)
            row["decode_fixed_s"] = max(one - row["decode_s"], 0.0)
        else:
            row["decode_s"] = statistics.median(dec[1:])
        if m.error_feedback:
            status, add = passes["status"], passes["add"]
            if m.path in (SPARSE, LOWRANK):
                # the status, acc = e + x in the residual; low rank: e = acc − x, one more pass
                row["encode_s"] += status + add
                if m.path is LOWRANK:
                    row["decode_s"] += add
            else:  # ErrorFeedback: the status, g + e, and e = g + e − decompress(payload)
                row["encode_s"] += status + 2 * add + row["decode_s"]
        methods[name] = row
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (
        f"CPU, {torch.get_num_threads()} thread(s)")
    return {"numel": numel, "dtype": "float32", "methods": methods,
            "source": f"measured by gradwire calibrate (each method's local work in a hook, "
                      f"no communication, a {flush.nbytes / 2**20:.0f} MiB cache flush before "
                      f"each timed call) on {where}: torch {torch.__version__}, "
                      f"median of {repeats}"}


def gradient(numel: int, seed: int, dev: torch.device) -> torch.Tensor:
    """``numel`` standard normal fp32 elements on ``dev``, the same for the same ``seed``:
    a bucket for a probe to compress."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(dev)


def feedback_passes(x: torch.Tensor, repeats: int, dev: torch.device,
                    flush: Flush | None = None) -> dict[str, float]:
    """Seconds of the passes over a bucket ``x`` that a hook with error feedback makes
    besides its codec: ``status`` (this rank's NaN/Inf status of x and its residual),
    ``add`` (the residual plus x, in place)."""
    e = torch.zeros_like(x)
    return {"status": _median_s(lambda: feedback.local_status(x, e), repeats, dev, flush),
            "add": _median_s(lambda: e.add_(x), repeats, dev, flush)}


def sparse_decode(method: str, x: torch.Tensor, k: int, repeats: int, dev: torch.device,
                  flush: Flush | None = None) -> dict[str, float]:
    """The local work of a sparse aggregation (:mod:`gradwire.sparse.allreduce`) after its
    messages, with the plans the hook runs, every rank's in this process and no network:
    ``decode_s``, the result written over the bucket. Top-k: ``decode_rank_s``, each rank's k
    entries added into the sum, from results over 2 and ``VOTE_RANKS`` ranks. gTop-k:
    ``merge_s``, one ⊤ of two ranks' k entries (a P = 2 butterfly's exchange, whose two
    merges are alike, halved); ``decode_s`` then puts this rank's drops back into its
    residual too."""
    def plans(p: int) -> list[Plan]:
        out = []
        for r in range(p):  # each rank its own gradient, so selections overlap only in part
            g = x if r == 0 else gradient(x.numel(), r, dev)
            residual = torch.zeros_like(x)
            out.append(sparse.plan(method, sparse.feed(g, residual, k, "exact"), k, x.numel(),
                                   residual, r, p))
        return out

    def run(ps: list[Plan]) -> None:
        execute_local(ps[0].schedule, [q.buffer for q in ps], [q.combine for q in ps])

    out = torch.empty_like(x)
    if method == "topk":  # the result does not change the plans: the same ones every time
        t = {}
        for p in (2, VOTE_RANKS):
            ps = plans(p)
            run(ps)
            t[p] = _median_s(lambda ps=ps: ps[0].average(out), repeats, dev, flush)
        per = max(t[VOTE_RANKS] - t[2], 0.0) / (VOTE_RANKS - 2)
        return {"decode_s": max(t[2] - 2 * per, 0.0), "decode_rank_s": per}
    merge, dec = [], []
    for cold in _colds(flush, repeats):  # the result takes the drops: new plans every time
        ps = plans(2)
        merge.append(_timed(lambda ps=ps: run(ps), dev, cold)[1] / 2)
        dec.append(_timed(lambda ps=ps: ps[0].average(out), dev, cold)[1])
    return {"decode_s": statistics.median(dec[1:]), "merge_s": statistics.median(merge[1:])}


class Flush:
    """Evicts a device's last-level cache: one write over a buffer of twice its size (the
    CPU's largest cache as sysfs gives it, a GPU's L2 as torch reports it)."""

    def __init__(self, dev: torch.device) -> None:
        self.nbytes = 2 * cache_bytes(dev)
        self.buf = torch.empty(self.nbytes // 4, dtype=torch.float32, device=dev)

    def __call__(self) -> None:
        self.buf.zero_()


def cache_bytes(dev: torch.device) -> int:
    """The size of ``dev``'s last-level cache, or a size no cache of its kind exceeds today
    where it cannot be read."""
    if dev.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)
        return int(size) if size else CUDA_L2_BYTES
    return cpu_cache_bytes() or CPU_CACHE_BYTES


def cpu_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest of this CPU's caches in bytes from Linux's sysfs (``index*/size``, as
    "32768K"), None where there is none to read."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    sizes = []
    for f in root.glob("index*/size"):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "")
        if number.isdigit():
            sizes.append(int(number) * units.get(unit, 1))
    return max(sizes, default=None)


def _timed(fn: Callable[[], object], dev: torch.device,
           flush: Flush | None = None) -> tuple[object, float]:
    """``fn()`` and its seconds, the device idle before (its cache flushed first, when given)
    and done after."""
    if flush is not None:
        flush()
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t0


def _median_s(fn: Callable[[], object], repeats: int, dev: torch.device,
              flush: Flush | None = None) -> float:
    times = [_timed(fn, dev, cold)[1] for cold in _colds(flush, repeats)]
    return statistics.median(times[1:])


def _colds(flush: Flush | None, repeats: int) -> list[Flush | None]:
    """What runs before each of ``repeats`` + 1 timed calls: nothing before the first, which
    warms up and whose time is not kept, ``flush`` before every other."""
    return [None, *[flush] * repeats]


def sync(dev: torch.device) -> None:
    """Wait for everything queued on ``dev`` (nothing to wait for on the CPU)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
