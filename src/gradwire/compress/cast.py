"""Half-precision casts (``fp16``, ``bf16``): the one compression that an allreduce can carry.

Ranks sum the cast payloads directly (associative), like PyTorch's fp16_compress_hook and
bf16_compress_hook: ring allreduce 2(P−1)α + 2((P−1)/P)·2n·β bytes, half of fp32's.
fp16 overflows to ±inf above 65504 (a sum of P payloads can overflow where no payload did);
bf16 keeps fp32's range with 8 bits of mantissa.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradwire.compress.base import Compressor, Payload, check_input, expect
from gradwire.errors import GradwireError


@dataclass(frozen=True, kw_only=True)
class CastPayload(Payload):
    values: torch.Tensor


class Cast(Compressor):
    """x cast to ``wire_dtype``; decompress casts back to x's dtype."""

    associative = True
    wire_dtype: torch.dtype

    def __init__(self) -> None:
        super().__init__()

    def compress(self, x: torch.Tensor) -> CastPayload:
        x = check_input(self.name, x)
        return CastPayload(dtype=x.dtype, values=x.to(self.wire_dtype, copy=True))

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        return expect(self.name, payload, CastPayload).values.to(payload.dtype)

    def decompress_into(self, payload: Payload, out: torch.Tensor) -> torch.Tensor:
        values = expect(self.name, payload, CastPayload).values
        if values.numel() != out.numel():
            raise GradwireError(f"{self.name}: this payload holds {values.numel()} elements, "
                                f"not the {out.numel()} asked for")
        return out.copy_(values)  # the cast back, in the one pass the copy makes anyway

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return numel * self.wire_dtype.itemsize

    def summed_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.wire_dtype


class FP16(Cast):
    name = "fp16"
    wire_dtype = torch.float16


class BF16(Cast):
    name = "bf16"
    wire_dtype = torch.bfloat16
