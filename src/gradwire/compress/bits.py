"""Packing small integer codes into bytes: the one place the quantizers get their bit layout.

Element i of a code stream of ``width`` bits sits in byte i // (8/width), at bit offset
(i mod 8/width)·width (little-endian within the byte). The last byte is zero-padded.

Decoding straight to values (:func:`decode_codes`) goes through a table of what each of the
256 bytes holds: one gather per byte, instead of unpacking every code to a byte and then
converting and scaling it in passes of their own.
"""

from __future__ import annotations

import functools

import torch

WIDTHS = (1, 2, 4, 8)


def packed_bytes(numel: int, width: int) -> int:
    """Bytes of ``numel`` codes of ``width`` bits: ceil(numel·width / 8)."""
    return -(-numel * width // 8)


def code_width(levels: int) -> int:
    """The narrowest width of ``WIDTHS`` that holds codes 0..levels-1."""
    for w in WIDTHS:
        if levels <= 1 << w:
            return w
    raise ValueError(f"{levels} levels do not fit in a byte")


def pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 codes, each < 2**width, packed 8/width to a byte."""
    if width == 8:
        return codes.to(torch.uint8, copy=True)
    per = 8 // width
    n = codes.numel()
    pad = -n % per
    c = codes.to(torch.uint8)
    if pad:
        c = torch.cat([c, c.new_zeros(pad)])
    c = c.reshape(-1, per)
    out = c[:, 0].clone()
    for j in range(1, per):
        out |= c[:, j] << (j * width)
    return out


def unpack_bits(packed: torch.Tensor, width: int, numel: int) -> torch.Tensor:
    """The first ``numel`` uint8 codes of ``packed`` (the inverse of :func:`pack_bits`)."""
    if width == 8:
        return packed[:numel]
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=packed.device)
    codes = (packed.unsqueeze(1) >> shifts) & ((1 << width) - 1)
    return codes.view(-1)[:numel]


# On CUDA, index_select gathered the table's rows of 16 or 32 bytes 8-15x slower than one
# value per element (1.97 against 0.24 ms for 25.6 M 1-bit codes to fp32 on an H100), and rows
# of 4 or 8 bytes faster (0.13-0.16 against 0.22-0.26 ms; benchmarks/results/
# decode_gather_cuda/latest.txt): above this, one value per element.
ROW_BYTES_CUDA = 8


def decode_codes(packed: torch.Tensor, width: int, numel: int,
                 values: torch.Tensor) -> torch.Tensor:
    """``values[code]`` for the first ``numel`` codes of ``packed``: the same elements as
    ``values[unpack_bits(packed, width, numel).long()]``, by one table lookup per byte (a
    256 × 8/width table of ``values``; ``values`` has 2**width entries)."""
    if values.numel() != 1 << width:
        raise ValueError(f"{width}-bit codes need {1 << width} values, got {values.numel()}")
    if width == 8:  # the table is values itself (gathering rows of one was 4x slower here)
        return values.index_select(0, packed[:numel].int())
    per = 8 // width
    if packed.is_cuda and per * values.element_size() > ROW_BYTES_CUDA:
        return values.index_select(0, unpack_bits(packed, width, numel).int())
    table = values[_byte_codes(width, packed.device)]  # (256, 8/width)
    return table.index_select(0, packed[: -(-numel // per)].int()).view(-1)[:numel]


@functools.cache
def _byte_codes(width: int, device: torch.device) -> torch.Tensor:
    """The codes each of the 256 bytes holds, (256, 8/width), as indices."""
    every_byte = torch.arange(256, dtype=torch.uint8, device=device)
    return unpack_bits(every_byte, width, 256 * (8 // width)).long().view(256, 8 // width)
