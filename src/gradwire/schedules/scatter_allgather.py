"""Broadcast as a binomial scatter then a ring allgather (van de Geijn; Barnett et al. 1994;
Thakur, Rabenseifner & Gropp 2005, the long-message broadcast of MPICH).

The buffer is cut into ``blocks(count, p)``; rank r's relative rank is v = (r − root) mod p.

1. scatter, ⌈lg p⌉ steps: for m = 2^(⌈lg p⌉−1), …, 2, 1, every relative rank v with v mod 2m = 0
   sends blocks v+m … min(v+2m, p)−1 (one contiguous range) to relative rank v+m, which then
   holds blocks v+m … min(v+2m, p)−1 and in the end block v+m.
2. allgather, p − 1 steps: ring.py's ring, rotated so that rank r starts with block
   (r − root) mod p. Everyone ends with the root's buffer.

Cost, n bytes divisible by p, any p: the root sends the most in every scatter step, ((p−1)/p)n in
all, so the scatter takes ⌈lg p⌉α + ((p−1)/p)nβ and the whole broadcast
(⌈lg p⌉ + p − 1)α + 2((p−1)/p)nβ — (lg p + p − 1)α + 2((p−1)/p)nβ for p a power of two. Against a
binomial broadcast's ⌈lg p⌉(α + nβ) it wins once n is large and p ≥ 3.

Example::

    gc.broadcast(params, src=0, algo="scatter_ag")
"""

from __future__ import annotations

from gradwire.schedules.ir import (
    Algorithm,
    Rows,
    Schedule,
    Table,
    Transfer,
    as_table,
    blocks,
    build,
    concat,
)
from gradwire.schedules.ring import ring_table


def scatter_steps(p: int, count: int, root: int) -> list[list[Transfer]]:
    """Binomial scatter of ``blocks(count, p)`` from ``root``: relative rank v ends with block v."""
    chunks = blocks(count, p)
    steps = []
    for m in (1 << k for k in reversed(range((p - 1).bit_length()))):
        step = []
        for v in range(0, p - m, 2 * m):
            first, (last, last_n) = chunks[v + m][0], chunks[min(v + 2 * m, p) - 1]
            step.append(Transfer((root + v) % p, (root + v + m) % p, first, last + last_n - first))
        steps.append(step)
    return steps


def broadcast_table(p: int, count: int, *, root: int = 0, **_: object) -> Table:
    """The scatter's p − 1 transfers, then the ring allgather's p(p − 1) made as arrays
    (:func:`~gradwire.schedules.ring.ring_table`): 16.8 M at p = 4096."""
    scatter = scatter_steps(p, count, root)
    return as_table(p, count, concat([Rows.of(scatter), ring_table(
        p, count, ((-root, False),), 1).rows().after(len(scatter))]))


def broadcast(p: int, count: int, *, root: int = 0, **_: object) -> Schedule:
    """Scatter blocks from the root, then ring-allgather them; everyone has root's buffer."""
    return build("scatter_ag", "broadcast", p, count,
                 broadcast_table(p, count, root=root).transfers_of(), root=root)


ALGORITHMS = (Algorithm("broadcast", "scatter_ag", broadcast, rooted=True,
                        table=broadcast_table),)
