"""Measuring a codec table (:mod:`gradwire.perf.codecs`) on this machine: every method's
encode and decode, the encode timed through the hook's own path."""

from __future__ import annotations

import statistics
import time

import torch

from gradwire.catalogue import METHODS, AggregationCall
from gradwire.compress import Compressor, get, majority_vote
from gradwire.hooks.state import make


def measure(numel: int = 4_000_000, repeats: int = 3, density: float = 0.001,
            rank: int = 4) -> dict:
    """Encode and decode medians of every method on ``numel`` random fp32 elements, here.

    decode: the compressor's decompress of one payload (gathered methods do it once per
    rank); for the vote, its time per rank (``decode_s``) and the rest (``decode_fixed_s``)
    from votes over 1 and ``VOTE_RANKS`` payloads. encode: the rest of what the hook does with
    one bucket on one rank — the call header's finiteness check, error feedback, compress,
    decompress, writing the bucket — timed through the hook itself (:func:`hook_seconds`)
    less one decode; where torch.distributed is already initialized, the compressor's
    compress alone.
    """
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    params = {"topk": {"density": density}, "randomk": {"density": density},
              "dgc": {"density": density}, "powersgd": {"rank": rank}}
    hook = hook_seconds(numel, repeats, density, rank)
    methods: dict[str, dict] = {"dense": {"params": {}, "encode_s": hook.get("dense", 0.0),
                                          "decode_s": 0.0}}
    for name, m in METHODS.items():
        if m.compressor is None:
            continue
        c = get(m.compressor, **params.get(m.compressor, {}))
        # the compressor combines the payloads its own way (signSGD's vote), not by
        # decompressing each one
        votes = type(c).combine is not Compressor.combine
        enc, dec = [], []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            payload = c.compress(x)
            t1 = time.perf_counter()
            c.decompress(payload, numel)
            enc.append(t1 - t0)
            dec.append(time.perf_counter() - t1)
        decode = statistics.median(dec[1:])
        row = {"params": params.get(m.compressor, {}), "decode_s": decode}
        if votes:
            one, many = (_median_s(lambda n=n, p=payload: majority_vote([p] * n, numel),
                                   repeats) for n in (1, VOTE_RANKS))
            decode = one  # what the one-rank hook spent on it
            row["decode_s"] = max(many - one, 0.0) / (VOTE_RANKS - 1)
            row["decode_fixed_s"] = max(one - row["decode_s"], 0.0)
        encode = (max(hook[name] - decode, 0.0) if name in hook
                  else statistics.median(enc[1:]))
        methods[name] = {**row, "encode_s": encode}
    how = "through the hook" if hook else "compressor only"
    return {"numel": numel, "dtype": "float32", "methods": methods,
            "source": f"measured by gradwire calibrate ({how}): torch {torch.__version__}, "
                      f"{torch.get_num_threads()} threads, median of {repeats}"}


VOTE_RANKS = 8
# bytes written between filling a bucket and timing its hook, so that the hook finds the
# caches holding other data, as in training: twice this machine's last-level cache (32 MiB)
EVICT_BYTES = 64 << 20


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def hook_seconds(numel: int, repeats: int = 3, density: float = 0.001,
                 rank: int = 4) -> dict[str, float]:
    """Seconds the hook's path takes with one bucket of ``numel`` elements on a one-rank
    process group made here, per method (median of ``repeats`` after one); {} when
    torch.distributed is already initialized (a second group cannot be made here)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        runs = {}
        src = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        for name in METHODS:
            state, plan = hook_path(name, density, rank)
            runs[name] = (state, plan,
                          state.positions.layout([torch.empty(numel)]), torch.empty(numel), [])
        # Round-robin, so that a slow spell of the machine lands on every method alike.
        for _ in range(repeats + 1):
            for state, plan, key, x, times in runs.values():
                x.copy_(src)  # as DDP refills its bucket
                t0 = time.perf_counter()
                state._bucket(x, key, plan, 0, False)  # noqa: SLF001
                times.append(time.perf_counter() - t0)
        return {name: statistics.median(r[-1][1:]) for name, r in runs.items()}
    finally:
        dist.destroy_process_group()


def hook_path(name: str, density: float = 0.001, rank: int = 4) -> tuple:
    """(state, call): method ``name``'s hook state on torch.distributed's default group and
    one bucket's call, as :meth:`gradwire.hooks.HookState.on_bucket` makes them, for running
    the hook's own path (``state._bucket(buf, key, call, index, last)``) without DDP to time it."""
    opts = {"rank": rank} if name == "powersgd" else {}
    state = make(name, density=density, warmup=False, overlap=False, **opts)
    comm = state._setup()  # noqa: SLF001 - the hook's own path, run here to time it
    return state, AggregationCall(METHODS[name], comm, state.compressor, state.ef, density,
                                  dense=False, name=state.call_name)
