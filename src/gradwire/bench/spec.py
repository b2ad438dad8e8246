"""Algorithm specs for ``gradwire bench``: ``ring``, ``ring:pipeline=4``, ``lp:block=65536``.

A spec names a registered algorithm (or ``builtin``, torch.distributed's own collective) and
optionally its parameters, so one run can set variants of an algorithm side by side. Values
are read as int, then float, else kept as strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradwire.errors import GradwireError, did_you_mean
from gradwire.schedules import registry
from gradwire.schedules.registry import parse_params

BUILTIN = "builtin"
REDUCING = ("allreduce", "reduce", "reducescatter")  # the collectives --op applies to
OPS = ("sum", "avg")
DTYPES = ("float32", "float16", "bfloat16", "float64")  # --dtype: what gradwire.bench.rank runs


def check_op(collective: str, op: str) -> None:
    """``--op``: sum or avg, and avg only where the collective reduces."""
    if op not in OPS:
        raise GradwireError(f"--op {op!r} is not supported: expected sum or avg")
    if op != "sum" and collective not in REDUCING:
        raise GradwireError(f"--op {op} applies to {', '.join(REDUCING)}: {collective} "
                            "does not reduce")


def check_dtype(dtype: str) -> None:
    """``--dtype``: one of ``DTYPES``."""
    if dtype not in DTYPES:
        raise GradwireError(f"--dtype {dtype!r} is not supported: expected float32, float16, "
                            "bfloat16 or float64")


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
    if a is not None:
        try:
            registry.check_params(a, params)
        except GradwireError as e:
            raise GradwireError(f"algorithm {text.strip()!r}: {e}") from None
    return AlgoSpec(text.strip(), name, params)


def parse_specs(collective: str, text: str | None) -> list[AlgoSpec]:
    """A comma list of specs; every algorithm of ``collective`` when ``text`` is None."""
    registry.get(collective)
    if text is None:
        return [AlgoSpec(a.name, a.name) for a in registry.algorithms(collective)]
    specs = [parse_spec(collective, t) for t in text.split(",") if t.strip()]
    if not specs:
        raise GradwireError(f"--algo {text!r} names no algorithm: expected a comma list such as "
                            "ring,lp:block=65536")
    return specs


def check_shared(collective: str, specs: list[AlgoSpec], params: dict) -> None:
    """Each ``--param`` must be taken by at least one algorithm of ``specs`` (it goes to
    those that take it): otherwise it is a typo or meant for an algorithm not run."""
    takers = {s.name: registry.parameters(registry.get(collective, s.name))
              for s in specs if s.name != BUILTIN}
    known = sorted({k for ks in takers.values() for k in ks})
    for k in params:
        if not any(k in ks for ks in takers.values()):
            raise GradwireError(f"--param {k}: no algorithm of {', '.join(takers) or 'none'} "
                                f"takes it{did_you_mean(k, known)}; they take "
                                f"{', '.join(known) or 'no parameters'}")


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
