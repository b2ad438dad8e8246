"""Warm-up: dense iterations first, then sparsifier densities that fall epoch by epoch to the
target (gTop-k paper, Shi et al. 2019, §V: densities 0.25, 0.0725, 0.015, 0.004 in the first four
epochs, then ρ = 0.001)."""

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


def parse(warmup: Sequence[float] | bool | None, dense_steps: int) -> Warmup:
    """None or True: the paper's densities; False or (): none; a sequence: those densities."""
    steps = check_int("hooks", "dense_steps", dense_steps, 0)
    if warmup is None or warmup is True:
        return Warmup(DEFAULT_DENSITIES, steps)
    if warmup is False:
        return Warmup((), steps)
    if isinstance(warmup, (str, bytes)) or not isinstance(warmup, Sequence):
        raise GradwireError(f"hooks: warmup must be None, True, False or a list of densities "
                            f"in (0, 1], got {warmup!r}")
    return Warmup(tuple(check_fraction("hooks", "warmup density", d) for d in warmup), steps)
