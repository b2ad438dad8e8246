"""Algorithm specs for ``gradwire bench``: ``ring``, ``ring:pipeline=4``, ``lp:block=65536``.

A spec names a registered algorithm (or ``builtin``, torch.distributed's own collective) and
optionally its parameters, so one run can set variants of an algorithm side by side. Values
are read as int, then float, else kept as strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gradwire.check import comma_items
from gradwire.errors import GradwireError, did_you_mean
from gradwire.schedules import registry
from gradwire.schedules.registry import parse_params
from gradwire.sizes import format_size

BUILTIN = "builtin"
REDUCING = ("allreduce", "reduce", "reducescatter")  # the collectives --op applies to
OPS = ("sum", "avg", "max", "min", "prod")  # --op, as nccl-tests' -o spells them
# --dtype: what gradwire.bench.rank runs, every one a dtype of c10d's gloo and NCCL (neither
# takes int16); the integers' sums wrap, as c10d's do
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1,
            "int32": 4, "int64": 8}
DTYPES = tuple(ITEMSIZE)
FLOATS = tuple(d for d in DTYPES if "float" in d)  # what --op avg takes
# Bytes the ranks of one run hold per byte of --sizes, all of them on this machine: each rank
# its buffer and the expected result (2 × size, and the check's weights, a byte an element:
# size / 4 more in float32, size / 2 in 16 bits, size in 8), and the master algorithm's rank 0
# the P − 1 buffers it receives at once, so about 3 × P × size in all, 4 × in a 1-byte dtype.
BUFFERS_PER_RANK = 3


def elements(size: int, itemsize: int, p: int, collective: str) -> int:
    """The elements a rank's buffer holds for ``size`` bytes: rounded down to whole elements
    and, for an allgather or reduce-scatter (whose buffer is P blocks), to a multiple of P, as
    nccl-tests does."""
    count = size // itemsize
    return count - count % p if collective in ("allgather", "reducescatter") else count


def measured_sizes(sizes: list[int], dtype: str, p: int, collective: str) -> list[int]:
    """``--sizes`` as the bytes the ranks measure (:func:`elements`), ascending, without the
    duplicates that rounding makes (1K and 1025 are one row of float32)."""
    item = ITEMSIZE[dtype]
    return sorted({elements(s, item, p, collective) * item for s in sizes})


def check_op(collective: str, op: str) -> None:
    """``--op``: one of ``OPS``, and other than sum only where the collective reduces."""
    if op not in OPS:
        raise GradwireError(f"--op {op!r} is not supported: expected sum, avg, max, min or "
                            "prod (a comma list of them, or all)")
    if op != "sum" and collective not in REDUCING:
        raise GradwireError(f"--op {op} applies to {', '.join(REDUCING)}: {collective} "
                            "does not reduce")


def check_dtype(dtype: str, op: str = "sum") -> None:
    """``--dtype``: one of ``DTYPES``, a float for ``--op avg``."""
    if dtype not in DTYPES:
        raise GradwireError(f"--dtype {dtype!r} is not supported: expected "
                            f"{', '.join(DTYPES[:-1])} or {DTYPES[-1]} (a comma list of them, "
                            "or all)")
    if op == "avg" and dtype not in FLOATS:
        raise GradwireError(f"--op avg needs a float --dtype ({', '.join(FLOATS[:-1])} or "
                            f"{FLOATS[-1]}), got {dtype}: an integer sum is not divided; time "
                            "--op sum")


ALL = "all"  # --dtype all, --op all: every one, as nccl-tests' -d all and -o all


def _names(text: str, option: str, every: tuple[str, ...]) -> list[str]:
    """A comma list of names, each once, or ``every`` for ``all``."""
    if text.strip() == ALL:
        return list(every)
    names = list(dict.fromkeys(comma_items(text)))
    if ALL in names:
        raise GradwireError(f"{option} {text!r}: all stands alone (every one), not in a list")
    if not names:
        raise GradwireError(f"{option} {text!r} names nothing: expected one, a comma list or "
                            "all")
    return names


def parse_dtypes(text: str) -> list[str]:
    """``--dtype``: one of ``DTYPES``, a comma list of them, or ``all``."""
    dtypes = _names(text, "--dtype", DTYPES)
    for d in dtypes:
        check_dtype(d)
    return dtypes


def parse_ops(collective: str, text: str) -> list[str]:
    """``--op``: one of ``OPS``, a comma list of them, or ``all`` where the collective
    reduces."""
    if text.strip() == ALL and collective not in REDUCING:
        raise GradwireError(f"--op all applies to {', '.join(REDUCING)}: {collective} does "
                            "not reduce")
    ops = _names(text, "--op", OPS)
    for op in ops:
        check_op(collective, op)
    return ops


def pairs(dtypes: list[str], ops: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """The (dtype, op) runs of ``dtypes`` × ``ops`` in nccl-tests' order (each dtype's ops,
    each op's sizes), and the integer dtypes left out of ``--op avg`` (:func:`check_dtype`);
    when that leaves none, its refusal."""
    kept = [(d, op) for d in dtypes for op in ops if op != "avg" or d in FLOATS]
    if not kept:
        check_dtype(dtypes[0], "avg")
    skipped = [d for d in dtypes if d not in FLOATS] if "avg" in ops else []
    return kept, skipped


@dataclass(frozen=True)
class AlgoSpec:
    label: str  # as written, e.g. "ring:pipeline=4"
    name: str  # the registered algorithm, e.g. "ring"
    params: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"label": self.label, "name": self.name, "params": self.params}


def parse_spec(collective: str, text: str) -> AlgoSpec:
    name, *rest = text.strip().split(":")
    a = None
    if name != BUILTIN:
        a = registry.get(collective, name)
        name = a.name
    elif rest:
        raise GradwireError(f"algorithm {text!r}: the builtin baseline takes no parameters")
    params = parse_params(rest, f"algorithm {text.strip()!r}: parameter")
    set_by_bench = [k for k in params if k in registry.COMMON]
    if set_by_bench:  # the run's --op and --dtype, which a spec must not contradict
        raise GradwireError(f"algorithm {text.strip()!r}: {set_by_bench[0]} is bench's own "
                            f"(--op, --dtype), not an algorithm's parameter")
    if a is not None:
        try:
            registry.check_params(a, params)
        except GradwireError as e:
            raise GradwireError(f"algorithm {text.strip()!r}: {e}") from None
    return AlgoSpec(text.strip(), name, params)


def parse_specs(collective: str, text: str | None) -> list[AlgoSpec]:
    """A comma list of specs, each once; every algorithm of ``collective`` when ``text`` is
    None."""
    registry.get(collective)
    if text is None:
        return [AlgoSpec(a.name, a.name) for a in registry.algorithms(collective)]
    # a spec given twice is run once: its rows and averages would merge under one label
    labels = dict.fromkeys(comma_items(text))
    specs = [parse_spec(collective, t) for t in labels]
    if not specs:
        raise GradwireError(f"--algo {text!r} names no algorithm: expected a comma list such as "
                            "ring,lp:block=65536")
    return specs


def check_shared(collective: str, specs: list[AlgoSpec], params: dict) -> None:
    """Each ``--param`` must be taken by at least one algorithm of ``specs`` (it goes to
    those that take it and do not set it in their spec): otherwise it is a typo, meant for an
    algorithm not run, or overridden everywhere (``--algo ring:pipeline=2 --param
    pipeline=4`` would run no algorithm with pipeline=4)."""
    takers = {s.name: registry.parameters(registry.get(collective, s.name))
              for s in specs if s.name != BUILTIN}
    known = sorted({k for ks in takers.values() for k in ks})
    for k in params:
        if not any(k in ks for ks in takers.values()):
            raise GradwireError(f"--param {k}: no algorithm of {', '.join(takers) or 'none'} "
                                f"takes it{did_you_mean(k, known)}; they take "
                                f"{', '.join(known) or 'no parameters'}")
        takes = [s for s in specs if s.name != BUILTIN and k in takers[s.name]]
        if all(k in s.params for s in takes):
            raise GradwireError(f"--param {k}: every algorithm that takes it sets its own "
                                f"({', '.join(s.label for s in takes)}), so it would reach "
                                "none")


BACKENDS = {"cpu": "gloo", "cuda": "nccl"}  # --device: the process group it runs over
DEVICES = tuple(BACKENDS)


def check_device(device: str) -> None:
    """``--device``: cpu (gloo), or cuda where a GPU and NCCL are there."""
    if device not in DEVICES:
        raise GradwireError(f"--device {device!r} is not supported: expected cpu or cuda")
    import torch
    import torch.distributed as dist

    if device == "cuda" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise GradwireError("--device cuda needs a CUDA device and a torch built with NCCL, "
                            "and this machine has none: use --device cpu")


def check_schedules(collective: str, specs: list[AlgoSpec], params: dict, p: int,
                    counts: list[int], itemsize: int) -> None:
    """Build every algorithm's schedule for ``p`` ranks at the smallest and the largest of
    ``counts`` (elements) with the parameters the ranks will give it (the ``--param`` values it
    takes, then its own), so that a value it refuses (``ring:pipeline=abc``, ``--param
    pipeline=-1``, ``lp:block=1`` at a size it would cut into too many blocks) is one line
    before any rank starts, instead of a traceback on every rank."""
    for s in specs:
        if s.name == BUILTIN:
            continue
        known = registry.parameters(registry.get(collective, s.name))
        shared = {k: v for k, v in params.items() if k in known and k not in s.params}
        try:
            for count in dict.fromkeys((min(counts), max(counts))):
                registry.table(collective, s.name, p, count, cached=False, itemsize=itemsize,
                               **shared, **s.params)
        except GradwireError as e:
            given = "".join(f" with --param {k}={v}" for k, v in shared.items())
            raise GradwireError(f"algorithm {s.label!r}{given}: {e}") from None


def available_memory(device: str) -> tuple[int, str]:
    """Bytes the ranks' buffers may take, and what they are: this machine's available memory
    (Linux's MemAvailable), or with ``device`` cuda GPU 0's free memory, which the emulated
    hosts share (its total would count what another process already holds)."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info(0)[0], "GPU 0's free"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib * 1024, "available"
    except (OSError, StopIteration, ValueError, IndexError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free"


def check_sizes(sizes: list[int], dtype: str, p: int, device: str,
                per_rank: bool = False) -> None:
    """``--sizes`` (ascending): the smallest holds an element of ``dtype`` (with
    ``per_rank``, an allgather's or reduce-scatter's, one for each of the ``p`` ranks: the
    ranks round a size down to a multiple of P elements), and ``p`` ranks' buffers for the
    largest (:data:`BUFFERS_PER_RANK` × P × size, one more in a 1-byte dtype) fit in
    :func:`available_memory` — checked here, because a rank that runs out of memory dies
    with a traceback, and the others with it."""
    item = ITEMSIZE[dtype]
    least = item * (p if per_rank else 1)
    if sizes[0] < least:
        whose = f" for each of {p} ranks" if per_rank else ""
        raise GradwireError(f"--sizes: {sizes[0]} bytes hold no {dtype} element{whose}: "
                            f"expected sizes of at least {least} bytes")
    have, what = available_memory(device)
    per_rank = BUFFERS_PER_RANK + (item == 1)  # the weights are as large as a 1-byte buffer
    most = have // (per_rank * p)
    if sizes[-1] > most:
        raise GradwireError(
            f"--sizes: {format_size(sizes[-1])} is too large for {p} ranks on this machine: "
            f"they would hold about {per_rank * p * sizes[-1] / 2**30:.3g} GiB in {dtype}, "
            f"and it has {have / 2**30:.3g} GiB of {what} memory: expected sizes up to "
            f"{size_below(most)}")


def size_below(n: int) -> str:
    """The largest size of whole M (else K, else bytes) that is at most ``n`` bytes, as
    --sizes takes it: a bound rounded to the nearest M could be one the check refuses."""
    for scale in (2**20, 2**10, 1):
        if n >= scale:
            return format_size(n // scale * scale)
    return "0"
