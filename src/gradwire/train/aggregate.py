"""How a rank's flat gradient becomes the global average. One registry, one entry per scheme."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from gradwire.errors import GradwireError

Aggregator = Callable[[torch.Tensor], torch.Tensor]


def dense_allreduce(flat: torch.Tensor) -> torch.Tensor:
    """Plain S-SGD: torch.distributed's all_reduce (gloo's is a ring), then divide by P."""
    dist.all_reduce(flat)
    return flat.div_(dist.get_world_size())


AGGREGATORS: dict[str, Aggregator] = {"dense": dense_allreduce}


def get_aggregator(name: str) -> Aggregator:
    if name not in AGGREGATORS:
        known = ", ".join(AGGREGATORS)
        raise GradwireError(f"unknown aggregation {name!r}: expected one of {known}")
    return AGGREGATORS[name]
