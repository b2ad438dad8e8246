"""What a user chose for a hook (:class:`HookConfig`, checked by :func:`gradwire.hooks.make`),
and how a call header names it."""

import inspect
from dataclasses import dataclass, field

import torch.distributed as dist

from gradwire.catalogue import METHODS as CATALOGUE
from gradwire.catalogue import Method
from gradwire.compress import COMPRESSORS, Compressor
from gradwire.hooks.warmup import Warmup

METHODS: tuple[str, ...] = tuple(CATALOGUE)


@dataclass(frozen=True)
class HookConfig:
    """What a user chose; checked by :func:`~gradwire.hooks.make`."""

    method: Method
    density: float = 0.001
    mode: str = "bucket"
    warmup: Warmup = field(default_factory=lambda: Warmup(()))
    steps_per_epoch: int | None = None
    group: dist.ProcessGroup | None = None
    seed: int = 0
    algo: str | None = None
    overlap: bool = True
    options: dict[str, object] = field(default_factory=dict)
    momentum: float = 0.0


def caller(config: HookConfig) -> str:
    """The call header's first field: "hook", with the hook's options that must be equal on
    all ranks and that no later step checks again (the mode where not "bucket", the dense
    steps where any)."""
    shown = [f"mode={config.mode}"] if config.mode != "bucket" else []
    if config.warmup.dense_steps:
        shown.append(f"dense_steps={config.warmup.dense_steps}")
    return " ".join(["hook", *shown])


def call_name(config: HookConfig, compressor: Compressor | None) -> str:
    """The method as the call header shows it: its name, the selector, and every option that
    must be equal on all ranks (``qsgd s=100``, ``powersgd rank=2 seed=0``), so that ranks
    made with different options fail naming them instead of averaging different things or
    sending messages of different lengths."""
    m = config.method
    params = inspect.signature(COMPRESSORS[m.compressor]).parameters if m.compressor else {}
    # every option at the value the compressor runs with, so that a rank that spells out a
    # default agrees with one that leaves it out
    shown = {k: config.options.get(k, params[k].default) for k in m.options
             if k != "selector" and k in params}
    if m.path.sums_payloads and "seed" in params:
        # the payloads are summed element by element, so the seed that draws random-k's
        # indices or PowerSGD's first Q must be the same everywhere (a top-k's sample of its
        # own gradient need not)
        shown["seed"] = config.seed
    if config.algo is not None:
        shown["algo"] = config.algo
    if config.momentum:
        shown["momentum"] = config.momentum
    selector = getattr(compressor, "selector", None)
    return m.name + (f"/{selector}" if selector else "") + "".join(
        f" {k}={v}" for k, v in sorted(shown.items()))

