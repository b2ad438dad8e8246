"""Gradient compression: what a rank sends instead of its dense gradient bucket.

One interface (:class:`Compressor`: compress, decompress, wire_bytes, associative), one shared
:class:`ErrorFeedback`, and one registry, ``COMPRESSORS``, that the CLI, the benchmarks and the
parametrized tests iterate over. ``get(name, **params)`` builds one with checked parameters.

| name      | module   | wire for n elements (fp32)            | associative |
|-----------|----------|---------------------------------------|-------------|
| topk      | sparse   | 8k bytes (int32 index + value)        | no          |
| randomk   | sparse   | 4k bytes (values; indices from seed)  | yes         |
| dgc       | sparse   | 8⌈1.25k⌉ + 4 bytes                    | no          |
| signsgd   | quantize | ⌈n/8⌉ bytes                           | no (vote)   |
| efsignsgd | quantize | ⌈n/8⌉ + 4 bytes                       | no          |
| qsgd      | quantize | 4 + ⌈n/8⌉ + ⌈n·w/8⌉ bytes, w ≤ 8 bits | no          |
| terngrad  | quantize | ⌈n/4⌉ + 4 bytes                       | no          |
| int8      | quantize | n + 4⌈n/1024⌉ bytes (a scale a block) | no (*)      |
| fp16/bf16 | cast     | 2n bytes                              | yes         |
| powersgd  | lowrank  | 4(rows + cols)·r bytes, rows·cols ≥ n | no (*)      |

(*) as a one-shot compressor of a flat tensor: :class:`PowerSGD`'s steps make it two
allreduces, each weight its own matrix (:func:`gradwire.compress.lowrank.layout`); int8's
aggregation shares each block's step size among the ranks, and their int8 values sum in one
allreduce.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from gradwire.compress.base import Compressor, Payload
from gradwire.compress.cast import BF16, FP16, CastPayload
from gradwire.compress.feedback import ErrorFeedback
from gradwire.compress.lowrank import (
    Layout,
    LowRankPayload,
    PowerSGD,
    PowerSGDCompressor,
    from_matrix,
    matrix_shape,
    to_matrix,
)
from gradwire.compress.quantize import (
    QSGD,
    EFSignSGD,
    Int8,
    Int8Payload,
    QSGDPayload,
    ScaledSignPayload,
    SignPayload,
    SignSGD,
    TernaryPayload,
    TernGrad,
    majority_vote,
)
from gradwire.compress.select import SELECTORS, exact_topk, threshold_topk
from gradwire.compress.sparse import (
    DGC,
    CountedPayload,
    RandomK,
    SharedIndexPayload,
    SparsePayload,
    TopK,
)
from gradwire.errors import GradwireError, did_you_mean, lookup

COMPRESSORS: dict[str, Callable[..., Compressor]] = {
    c.name: c for c in (TopK, RandomK, DGC, SignSGD, EFSignSGD, QSGD, TernGrad, Int8, FP16,
                        BF16, PowerSGDCompressor)
}


def get(name: str, **params: object) -> Compressor:
    """The compressor ``name`` built with ``params``; unknown names and parameters, and values
    out of range, raise a one-line GradwireError that says what is allowed."""
    factory = lookup(COMPRESSORS, name, "compressor")
    allowed = list(inspect.signature(factory).parameters)
    for p in params:
        if p not in allowed:
            raise GradwireError(f"{name}: unknown parameter {p!r}{did_you_mean(p, allowed)}: "
                                f"expected "
                                f"{', '.join(allowed) or 'no parameters'}")
    return factory(**params)


__all__ = [
    "BF16", "COMPRESSORS", "DGC", "EFSignSGD", "FP16", "QSGD", "CastPayload", "Compressor",
    "Int8", "Int8Payload",
    "CountedPayload", "ErrorFeedback", "Layout", "LowRankPayload", "Payload", "PowerSGD",
    "PowerSGDCompressor", "QSGDPayload", "RandomK", "ScaledSignPayload", "SharedIndexPayload",
    "SignPayload", "SignSGD", "SparsePayload", "TernGrad", "TernaryPayload", "TopK",
    "SELECTORS", "exact_topk", "from_matrix", "get", "majority_vote", "matrix_shape",
    "threshold_topk", "to_matrix",
]
