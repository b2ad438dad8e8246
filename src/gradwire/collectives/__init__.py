"""Collectives with a choice of algorithm, usable in any torch.distributed program."""

from gradwire.collectives.api import (
    all_gather_into_tensor,
    all_reduce,
    broadcast,
    reduce,
    reduce_scatter_tensor,
)

# torch 2.13's names for the same two calls (c10d's old names still work there, with a warning)
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor

__all__ = ["all_gather_into_tensor", "all_gather_single", "all_reduce", "broadcast", "reduce",
           "reduce_scatter_single", "reduce_scatter_tensor"]
