"""Half-precision casts (``fp16``, ``bf16``): the one compression that an allreduce can carry.

Ranks sum the cast payloads directly (associative), like PyTorch's fp16_compress_hook and
bf16_compress_hook: ring allreduce 2(P−1)α + 2((P−1)/P)·2n·β bytes, half of fp32's.
fp16 overflows to ±inf above 65504 (a sum of P payloads can overflow where no payload did);
bf16 keeps fp32's range with 8 bits of mantissa, all but its top: bf16's largest value is
3.3895e38, and an fp32 value from about 3.3961e38 up rounds to ±inf on the wire, as fp16's do
from 65520.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradwire.compress.base import Compressor, Payload, check_input, expect
from gradwire.dtypes import FLOATS
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
        values = expect(self.name, payload, CastPayload).values
        return _within(values, values.to(payload.dtype))

    def decompress_into(self, payload: Payload, out: torch.Tensor) -> torch.Tensor:
        values = expect(self.name, payload, CastPayload).values
        if not (isinstance(out, torch.Tensor) and out.dim() == 1 and out.dtype in FLOATS):
            # a 2-D out of as many elements was a RuntimeError of the copy's broadcast, an
            # integer one a TypeError of finfo after the copy had written it
            got = (f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise GradwireError(f"{self.name}: out must be a 1-D float tensor (fp16, bf16, "
                                f"fp32, fp64), got {got}")
        if values.numel() != out.numel():
            raise GradwireError(f"{self.name}: this payload holds {values.numel()} elements, "
                                f"not the {out.numel()} asked for")
        # the cast back, in the one pass the copy makes anyway
        return _within(values, out.copy_(values))

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return numel * self.wire_dtype.itemsize

    def summed_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.wire_dtype


def _within(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out``, the wire's ``values`` cast back, with the finite ones that the cast made
    ±inf set to ± the largest value of ``out``'s dtype, in place; an inf on the wire stays
    inf. Only a wire of a wider range than the bucket's (bf16 for an fp16 bucket) can do
    that: bf16 rounds fp16's largest value, 65504, up to 65536, which came back as inf (a
    finite gradient, and an average of finite gradients, applied as inf). No host read."""
    top = torch.finfo(out.dtype).max
    if torch.finfo(values.dtype).max <= top:
        return out
    return out.copy_(torch.where(values.isinf(), out, out.clamp(-top, top)))


class FP16(Cast):
    name = "fp16"
    wire_dtype = torch.float16


class BF16(Cast):
    name = "bf16"
    wire_dtype = torch.bfloat16
