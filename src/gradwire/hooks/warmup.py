"""Warm-up, only when asked for: dense iterations first, then sparsifier densities that fall
epoch by epoch to the target (gTop-k paper, Shi et al. 2019, §V: densities 0.25, 0.0725, 0.015,
0.004 in the first four epochs, then ρ = 0.001). The hook counts the epochs itself from its
steps (``steps_per_epoch``), so a user who calls nothing gets what was configured; without
warm-up the target density is sent from the first step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gradwire.check import check_fraction, check_int
from gradwire.errors import GradwireError

DEFAULT_DENSITIES = (0.25, 0.0725, 0.015, 0.004)


@dataclass(frozen=True)
class Warmup:
    """``dense_steps`` dense iterations, then ``densities[e]`` in epoch e (never below the
    target density), then the target."""

    densities: tuple[float, ...] = DEFAULT_DENSITIES
    dense_steps: int = 0

    def density(self, epoch: int, target: float) -> float:
        if epoch < len(self.densities):
            return max(self.densities[epoch], target)
        return target

    def dense(self, step: int) -> bool:
        return step < self.dense_steps


def parse(warmup: Sequence[float] | bool | None, dense_steps: int,
          steps_per_epoch: int | None = None) -> Warmup:
    """None or False (the default): none; True: the paper's densities; a sequence: those
    densities, each for one epoch of ``steps_per_epoch`` steps, which a warm-up needs."""
    steps = check_int("hooks", "dense_steps", dense_steps, 0)
    if steps_per_epoch is not None:
        check_int("hooks", "steps_per_epoch", steps_per_epoch, 1)
    if warmup is None or warmup is False:
        return Warmup((), steps)
    if warmup is True:
        warmup = DEFAULT_DENSITIES
    if isinstance(warmup, (str, bytes)) or not isinstance(warmup, Sequence):
        raise GradwireError(f"hooks: warmup must be None, True, False or a list of densities "
                            f"in (0, 1], got {warmup!r}")
    densities = tuple(check_fraction("hooks: warmup density", d) for d in warmup)
    if densities and steps_per_epoch is None:
        raise GradwireError("hooks: a warm-up needs steps_per_epoch=N (how many steps each "
                            "warm-up density lasts; the paper: one epoch), so that the hook "
                            "counts it itself")
    return Warmup(densities, steps)
