"""Ways to decode packed codes on a CUDA GPU: what ``bits.ROW_BYTES_CUDA`` rests on.

For 25.6 M codes of width 1, 2, 4 and 8 bits and fp32 / fp16 values, the median time (CUDA
events, 40 calls) of: the byte table's rows gathered with index_select (``current``, what
decode_codes did everywhere before b411d2f), with advanced indexing and with embedding; and
every code unpacked to a byte first, then one value per element (advanced indexing, take,
index_select with int32 indices). Every way must give the same elements as the first
unpacked one (else WRONG). Prints one line per (width, dtype).

    python benchmarks/decode_gather_cuda.py      # needs a CUDA device
Its one run is benchmarks/results/decode_gather_cuda/latest.txt.
"""
import argparse
import statistics

import torch

from gradwire.compress.bits import _byte_codes, decode_codes, unpack_bits

N = 25_600_000


def median_ms(fn, reps: int = 40) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ways(packed: torch.Tensor, width: int, values: torch.Tensor) -> dict:
    """Every way to decode, each a function of nothing (the codes and values bound here)."""
    rows = packed[: -(-N // (8 // width))]
    table = values[_byte_codes(width, packed.device)]
    return {
        "current": lambda: decode_codes(packed, width, N, values),
        "unpack+index": lambda: values[unpack_bits(packed, width, N).long()],
        "unpack+take": lambda: torch.take(values, unpack_bits(packed, width, N).long()),
        "unpack+int index_select":
            lambda: values.index_select(0, unpack_bits(packed, width, N).int()),
        "rows adv-index long": lambda: table[rows.long()].view(-1)[:N],
        "rows index_select long": lambda: table.index_select(0, rows.long()).view(-1)[:N],
        "rows embedding":
            lambda: torch.nn.functional.embedding(rows.long(), table).view(-1)[:N],
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_gather_cuda.py needs a CUDA device: none here")
    for width in (1, 2, 4, 8):
        packed = torch.randint(0, 256, (-(-N // (8 // width)),), dtype=torch.uint8,
                               device="cuda")
        for dt in (torch.float32, torch.float16):
            values = torch.randn(1 << width, device="cuda").to(dt)
            ref = values[unpack_bits(packed, width, N).long()]
            out = [f"{k} {median_ms(f):.3f}{'' if torch.equal(f(), ref) else ' WRONG'}"
                   for k, f in ways(packed, width, values).items()]
            print(f"width {width} {dt}: " + " | ".join(out), flush=True)


if __name__ == "__main__":
    main()
