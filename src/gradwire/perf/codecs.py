"""Encode and decode time of each aggregation method: the part of compression the model cannot
hide behind communication (it runs on the hook's thread, before and after each bucket's
messages).

A codec table is JSON: ``numel`` (the gradient the times were measured on), ``source`` and, per
method, ``encode_s`` and ``decode_s`` with the ``params`` used. Times scale in proportion to the
elements compressed. Methods that gather payloads (``gather`` and ``vote`` in
:data:`gradwire.hooks.methods.TABLE`) decode every rank's payload, so their decode is P times
the table's ``decode_s``, plus ``decode_fixed_s`` where a method has one: the majority vote
counts all ranks' bits in one pass whatever P is, so its cost is mostly fixed. Built-in
tables: ``here`` (this machine's compress_speed benchmark) and ``v100`` (Table 2 of the
compression-utility paper: one encode+decode number per method). ``gradwire calibrate``
measures a table on the machine it runs on and stores it with α, β, γ; pass that calibration
file as the table.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from gradwire.errors import GradwireError, did_you_mean
from gradwire.hooks.methods import TABLE
from gradwire.jsonfile import parse_object, read_object


@dataclass(frozen=True)
class CodecTable:
    name: str
    numel: int
    methods: dict[str, dict]
    source: str

    def seconds(self, method: str, numel: int, world_size: int) -> tuple[float, float]:
        """(encode, decode) seconds for one bucket of ``numel`` elements."""
        if method not in self.methods:
            raise GradwireError(f"codec table {self.name!r} has no encode/decode time for "
                                f"{method!r} (it has {', '.join(self.methods)}): use another "
                                f"--codecs table or run gradwire calibrate")
        m, scale = self.methods[method], numel / self.numel
        gathered = TABLE[method].combine in ("gather", "vote")
        decode = m.get("decode_fixed_s", 0.0) + m["decode_s"] * (world_size if gathered else 1)
        return m["encode_s"] * scale, decode * scale


BUILTIN = ("here", "v100")


def load(name_or_path: str) -> CodecTable:
    """The built-in table ``name_or_path`` or the table in that JSON file (a calibration file's
    ``codecs``); every defect is a one-line error naming the field."""
    where = f"codec table {name_or_path}"
    if name_or_path in BUILTIN:
        text = resources.files("gradwire.perf").joinpath("codecs", f"{name_or_path}.json")
        doc = parse_object(text.read_text(), where)
    elif Path(name_or_path).is_file():
        doc = read_object(name_or_path, where)
        doc = doc.get("codecs", doc)  # a calibration file keeps its table under "codecs"
    else:
        raise GradwireError(f"unknown codec table {name_or_path!r}"
                            f"{did_you_mean(name_or_path, BUILTIN)}: expected "
                            f"{', '.join(BUILTIN)} or a JSON file")
    numel, methods = doc.get("numel"), doc.get("methods")
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise GradwireError(f"{where}: field 'numel' must be an integer >= 1 (the elements the "
                            f"times were measured on), got {numel!r}")
    if not isinstance(methods, dict):
        raise GradwireError(f"{where}: field 'methods' must be an object of methods, got "
                            f"{methods!r}")
    for name, m in methods.items():
        if not isinstance(m, dict):
            raise GradwireError(f"{where}: methods.{name} must be an object with encode_s and "
                                f"decode_s, got {m!r}")
        for key in ("encode_s", "decode_s", "decode_fixed_s"):
            v = m.get(key, 0.0 if key == "decode_fixed_s" else None)  # decode_fixed_s: optional
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise GradwireError(f"{where}: methods.{name}.{key} must be a number of seconds "
                                    f">= 0, got {v!r}")
    return CodecTable(name_or_path, numel, dict(methods), str(doc.get("source", "")))


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
    from gradwire.compress import get, majority_vote

    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    params = {"topk": {"density": density}, "randomk": {"density": density},
              "dgc": {"density": density}, "powersgd": {"rank": rank}}
    hook = hook_seconds(numel, repeats, density, rank)
    methods: dict[str, dict] = {"dense": {"params": {}, "encode_s": hook.get("dense", 0.0),
                                          "decode_s": 0.0}}
    for name, m in TABLE.items():
        if m.compressor is None:
            continue
        c = get(m.compressor, **params.get(m.compressor, {}))
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
        if m.combine == "vote":
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
        for name in TABLE:
            state, plan = hook_path(name, density, rank)
            runs[name] = (state, plan,
                          state.positions.layout([torch.empty(numel)]), torch.empty(numel), [])
        # Round-robin, so that a slow spell of the machine lands on every method alike.
        for _ in range(repeats + 1):
            for state, plan, key, x, times in runs.values():
                x.copy_(src)  # as DDP refills its bucket
                t0 = time.perf_counter()
                state._bucket(x, key, plan, False)  # noqa: SLF001
                times.append(time.perf_counter() - t0)
        return {name: statistics.median(r[-1][1:]) for name, r in runs.items()}
    finally:
        dist.destroy_process_group()


def hook_path(name: str, density: float = 0.001, rank: int = 4) -> tuple:
    """(state, plan): method ``name``'s hook state on torch.distributed's default group and
    one bucket's plan, as :meth:`gradwire.hooks.HookState.on_bucket` makes them, for running
    the hook's own path (``state._bucket(buf, key, plan, last)``) without DDP to time it."""
    from gradwire.hooks.methods import Step
    from gradwire.hooks.state import make

    opts = {"rank": rank} if name == "powersgd" else {}
    state = make(name, density=density, warmup=False, overlap=False, **opts)
    comm = state._setup()  # noqa: SLF001 - the hook's own path, run here to time it
    return state, Step(TABLE[name], comm, state.compressor, state.ef, density, dense=False,
                       name=state.call_name)
