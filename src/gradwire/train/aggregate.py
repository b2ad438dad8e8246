"""How a rank's gradients become the global average: DistributedDataParallel with a gradwire
communication hook (``gradwire.hooks``), for every method, dense included, so every row of a
comparison pays DDP's bucketing and overlap alike.

:class:`HookedDDP` is what the training loop holds: ``start(model)`` returns the module to
run forward on; ``set_epoch`` moves the warm-up on; ``stats`` are the hook's cumulative
``compress`` and ``communicate`` seconds (on the hook's thread, overlapping backward),
``tail`` (the part backward did not hide) and ``sent`` payload bytes; ``state_dict()`` is what
a checkpoint keeps of this rank's aggregation (error-feedback residuals, compressor steps).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradwire.check import check_powersgd_rank
from gradwire.errors import GradwireError
from gradwire.hooks import METHODS, make

__all__ = ["METHODS", "HookedDDP", "check_rank"]


def check_rank(method: str, rank: int | None) -> None:
    """``--rank`` of a training run: None, or PowerSGD's rank with ``--agg powersgd``."""
    if rank is None:
        return
    if method != "powersgd":
        raise GradwireError(f"--rank is PowerSGD's rank: --agg {method} has none (use "
                            f"--agg powersgd)")
    check_powersgd_rank(rank)


class HookedDDP:
    def __init__(self, method: str, density: float, mode: str, warmup: bool, seed: int,
                 steps_per_epoch: int, options: dict[str, Any] | None = None) -> None:
        if method not in METHODS:
            raise GradwireError(f"unknown aggregation {method!r}: expected one of "
                                f"{', '.join(METHODS)}")
        # warmup True: the gTop-k paper's densities 0.25, 0.0725, 0.015, 0.004 in epochs 0-3.
        self.hook = make(method, density=density, mode=mode, warmup=warmup, seed=seed,
                         steps_per_epoch=steps_per_epoch, **(options or {}))

    def start(self, model: nn.Module) -> nn.Module:
        # Gradients as views of DDP's buckets: backward writes them in place, so neither the
        # copy into the buckets nor the copy back out is made (the optimizer must not set
        # them to None: the trainer zeroes them).
        # Model mode aggregates once the last bucket is in, so buckets would overlap nothing:
        # one bucket of every gradient is aggregated where it lies (HookState._model, in
        # hooks.aggregate).
        cap = None
        if self.hook.config.mode == "model":
            cap = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20 + 1
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=cap)
        self.hook.register(ddp)
        return ddp

    @property
    def stats(self) -> dict[str, float]:
        return self.hook.stats

    @property
    def density(self) -> float:
        """The density this epoch's iterations use (1.0 for methods that do not sparsify)."""
        return self.hook.density

    def set_epoch(self, epoch: int) -> None:
        self.hook.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.hook.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hook.load_state_dict(state)
