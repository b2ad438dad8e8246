"""Blocks of a flat bucket: consecutive runs of ``block`` elements, the last one shorter where
the bucket's size is not a multiple. int8 (:mod:`gradwire.compress.quantize`) scales each
block by its own largest magnitude, so one large value costs the resolution of its block only.
Each helper makes one pass over the bucket: its whole blocks as one rows × columns view, and
the short block, if any, as one more row."""

from __future__ import annotations

import torch


def count(n: int, block: int) -> int:
    """Blocks of ``block`` elements in ``n`` (the last may be shorter)."""
    return -(-n // block)


def ranges(n: int, block: int) -> list[tuple[slice, slice, tuple[int, int]]]:
    """(elements, blocks, rows × columns) of at most two ranges covering ``n`` elements in
    whole blocks: the full blocks, then the short one."""
    full = n // block
    out = []
    if full:
        out.append((slice(0, full * block), slice(0, full), (full, block)))
    if n > full * block:
        out.append((slice(full * block, n), slice(full, full + 1), (1, n - full * block)))
    return out


def aminmax(t: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each block's minimum and maximum (1-D, in ``t``'s dtype; NaN propagates)."""
    # amin and amax, not aminmax(dim=1): on the CPU that one was 6x slower than both together
    parts = [(v.amin(dim=1), v.amax(dim=1))
             for v in (t[el].view(shape) for el, _, shape in ranges(t.numel(), block))]
    if not parts:
        empty = t.new_empty(0)
        return empty, empty
    return torch.cat([lo for lo, _ in parts]), torch.cat([hi for _, hi in parts])


def magnitude(t: torch.Tensor, block: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(each block's largest |t| (1-D; ``block`` None: one element, the whole of ``t`` in
    one aminmax pass), t's minimum and maximum (1-D, 2 elements)); NaN propagates to both."""
    if block is None and t.numel():
        ends = torch.stack(list(t.aminmax()))
        return ends.abs().max().reshape(1), ends
    lo, hi = aminmax(t, block or 1)
    if not lo.numel():
        return lo, t.new_zeros(2)
    return torch.maximum(lo.abs(), hi.abs()), torch.stack([lo.min(), hi.max()])


def mul(src: torch.Tensor, v: torch.Tensor, block: int, out: torch.Tensor) -> torch.Tensor:
    """``out`` = each element of ``src`` times its block's entry of ``v``, in ``out``'s dtype
    (``out`` may be ``src``)."""
    for el, bl, shape in ranges(src.numel(), block):
        torch.mul(src[el].view(shape), v[bl, None], out=out[el].view(shape))
    return out


def sub_product_(acc: torch.Tensor, t: torch.Tensor, v: torch.Tensor, block: int
                 ) -> torch.Tensor:
    """``acc`` −= ``t`` times its block's entry of ``v``, in place, one fused pass."""
    for el, bl, shape in ranges(acc.numel(), block):
        acc[el].view(shape).addcmul_(t[el].view(shape), v[bl, None], value=-1)
    return acc
