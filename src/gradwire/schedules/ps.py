"""Parameter-server allreduce (Li et al., OSDI 2014; TensorFlow's ``replica_device_setter``).

All p ranks are workers; ranks 0 … S−1 also host the S servers (``servers=S``, 1 ≤ S ≤ p).
Each server owns a shard of the buffer:
- ``sharding="even"``: server s owns block s of ``blocks(count, S)``;
- ``sharding="roundrobin"``: the buffer is the tensors of ``tensor_sizes`` (element counts,
  a tuple summing to count) laid end to end, and tensor i lives on server i mod S, whole, as
  TensorFlow places variables; each tensor then moves as its own message.

1. push: every worker sends each shard to its server, which sums them;
2. pull: every server sends its reduced shard back to every worker.
Everyone ends with the sum.

Cost, even sharding, n bytes divisible by S. In the push a server receives p − 1 shards of
n/S bytes and sums them, while its own worker sends S − 1 shards; a worker that hosts no server
sends S shards, Sα + nβ, which is no more than (p−1)(α + (n/S)β) because then S ≤ p − 1. So the
push takes (p−1)(α + (n/S)β) + (p−1)(n/S)γ, the pull (p−1)(α + (n/S)β), in all
2(p−1)(α + (n/S)β) + (p−1)(n/S)γ. S = 1 is the master algorithm, 2(p−1)(α + nβ) + (p−1)nγ;
S = p is a direct reduce-scatter and allgather, with the ring's bandwidth terms
2((p−1)/p)nβ + ((p−1)/p)nγ but only two steps of p − 1 messages each. Round-robin shards are as
uneven as the tensors: the busiest server's bytes and tensor count set the time.

Example::

    gc.all_reduce(grad, algo="ps", servers=2, sharding="roundrobin", tensor_sizes=(300, 20, 80))
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from gradwire.check import is_int
from gradwire.errors import GradwireError
from gradwire.schedules.ir import Algorithm, Schedule, Table, blocks, build, check_transfers
from gradwire.schedules.lp import MAX_BLOCKS

SHARDINGS = ("even", "roundrobin")


def shards(count: int, servers: int, sharding: str = "even",
           tensor_sizes: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
    """(server, start, size) of every piece of the buffer, in buffer order."""
    if sharding not in SHARDINGS:
        raise GradwireError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    if sharding == "even":
        if tensor_sizes is not None:
            raise GradwireError("tensor_sizes is used only with sharding='roundrobin'")
        return [(s, start, size) for s, (start, size) in enumerate(blocks(count, servers))]
    sizes = list(tensor_sizes or ())
    if len(sizes) > MAX_BLOCKS:
        # each tensor is a message from every worker and back to every worker: 10**6 of them
        # at P = 4 took 6.5 s to build as 6 M transfers (lp.py bounds its blocks alike)
        raise GradwireError(f"tensor_sizes names {len(sizes)} tensors, a message each from and "
                            f"to every worker: at most {MAX_BLOCKS}")
    if not all(is_int(n, 0) for n in sizes) or sum(sizes) != count:
        raise GradwireError(f"tensor_sizes must be element counts >= 0 that sum to the buffer's "
                            f"{count} elements, got {tensor_sizes!r}")
    sizes = [int(n) for n in sizes]  # numpy's integers too, as the registry accepts them
    starts = accumulate(sizes, initial=0)  # one more than sizes: the end
    return [(i % servers, start, size)
            for i, (start, size) in enumerate(zip(starts, sizes, strict=False))]


def allreduce_table(p: int, count: int, *, servers: int = 1, sharding: str = "even",
                    tensor_sizes: Sequence[int] | None = None, **_: object) -> Table:
    """Every shard from every other worker to its server (step 0), then back (step 1), shard
    by shard in buffer order and worker by worker, made as arrays: 2(p − 1) transfers a shard,
    33.5 M for p = 4096 servers."""
    if not is_int(servers, 1, p):
        raise GradwireError(f"servers must be an int in 1..{p} (the world size), got "
                            f"{servers!r}")
    server, start, size = np.array(shards(count, servers, sharding, tensor_sizes),
                                   dtype=np.int64).reshape(-1, 3).T
    sent = size > 0  # an empty shard is no message
    server, start, size = server[sent], start[sent], size[sent]
    check_transfers("allreduce", "ps", p, count, 2 * (p - 1) * len(size),
                    "give fewer tensors in tensor_sizes, or sharding='even'")
    piece, worker = np.nonzero(np.arange(p)[None, :] != server[:, None])  # [piece, worker]
    server = server[piece]
    step = np.repeat(np.arange(2, dtype=np.int64), len(piece))  # push, then pull
    return Table(p, count, step, np.concatenate([worker, server]),
                 np.concatenate([server, worker]), np.tile(start[piece], 2),
                 np.tile(size[piece], 2), step == 0)


def allreduce(p: int, count: int, *, servers: int = 1, sharding: str = "even",
              tensor_sizes: Sequence[int] | None = None, **_: object) -> Schedule:
    """Push every shard to its server (summed), then pull the sums back to every worker."""
    t = allreduce_table(p, count, servers=servers, sharding=sharding, tensor_sizes=tensor_sizes)
    return build("ps", "allreduce", p, count, t.transfers_of(), servers=servers,
                 sharding=sharding)


ALGORITHMS = (Algorithm("allreduce", "ps", allreduce, table=allreduce_table),)
