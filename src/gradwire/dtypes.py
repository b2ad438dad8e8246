"""The dtypes gradients come in, and the dtypes that go with them on the wire and in sums."""

from __future__ import annotations

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of norms, scales and sums: fp64 for fp64 input, fp32 otherwise (an fp16 norm
    of a large bucket overflows at 65504)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def index_dtype(numel: int) -> torch.dtype:
    """int32 indices while they fit (half the bytes of int64 on the wire), else int64."""
    return torch.int32 if numel < 2**31 else torch.int64
