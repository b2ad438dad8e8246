"""The aggregation catalogue: every method's path, written once.

For each method it says what each rank sends, which collectives it issues with what sizes in
what order (:meth:`Method.plan`), how the payloads combine (its :class:`~.paths.Path` and its
compressor's ``combine``), and, through its compressor, whether it keeps a residual, takes a
density or draws per-rank randomness. The DDP hooks run it (:func:`issuer`, :func:`start`), the
performance model prices its plan and the simulator replays it; none of them has a copy.

Example::

    from gradwire import catalogue
    plan = catalogue.get("powersgd").plan(numel=1024 * 1024 + 1024, world=8,
                                          shapes=[(1024, 1024), (1024,)])
    [(c.collective, c.algo, c.nbytes, c.what) for c in plan.calls]
    # [('allreduce', 'ring', 20484, 'P'), ('allreduce', 'ring', 16384, 'Q')]

| method    | path     | on the wire from each rank (fp32, n elements, k = ⌈density·n⌉) |
|-----------|----------|-----------------------------------------------------------------|
| dense     | dense    | 4n (one allreduce)                                              |
| fp16/bf16 | summed   | 2n (one allreduce)                                              |
| randomk   | summed   | 4k (one allreduce; indices from the shared seed)                |
| topk      | sparse   | 8k, allgather (recursive doubling, or Bruck's) of every rank's  |
| gtopk     | sparse   | 8k per step: butterfly with the ⊤ merge (the paper's tree: algo) |
| dgc       | gathered | 8⌈1.25k⌉ + 4 (one allgather)                                    |
| signsgd   | gathered | ⌈n/8⌉ (one allgather, majority vote)                            |
| efsignsgd | gathered | ⌈n/8⌉ + 4                                                       |
| qsgd      | gathered | 4 + ⌈n/8⌉ + ⌈n·w/8⌉                                             |
| terngrad  | gathered | ⌈n/4⌉ + 4                                                       |
| int8      | scaled   | n + 8⌈n/1024⌉ + 2 (levels, votes for the next steps, status)    |
| powersgd  | lowrank  | 4·(Σ rows·r + uncompressed + 1), then 4·Σ cols·r (2 allreduces) |
"""

from gradwire.catalogue.calls import BucketPlan, CollectiveCall
from gradwire.catalogue.methods import (
    METHODS,
    MODES,
    Method,
    get,
    issuer,
    start,
)
from gradwire.catalogue.paths import AggregationCall, Issued, Path, Shapes, Started

__all__ = ["METHODS", "MODES", "AggregationCall", "BucketPlan", "CollectiveCall", "Issued",
           "Method", "Path", "Shapes", "Started", "get", "issuer", "start"]
