"""Collectives with a choice of algorithm, usable in any torch.distributed program."""

from gradwire.collectives.api import (
    all_gather_into_tensor,
    all_reduce,
    broadcast,
    reduce,
    reduce_scatter_tensor,
)

__all__ = ["all_gather_into_tensor", "all_reduce", "broadcast", "reduce",
           "reduce_scatter_tensor"]
