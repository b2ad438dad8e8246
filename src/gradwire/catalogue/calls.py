"""What one bucket's aggregation puts on the wire: the collectives it issues, in order, and the
bytes of this rank's payload. The hooks run these calls, the performance model prices them and
the simulator replays them; each reads them from here."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gradwire.schedules import registry
from gradwire.schedules.ir import Schedule, Table


@dataclass(frozen=True)
class CollectiveCall:
    """One collective: ``count`` elements of ``itemsize`` bytes in every rank's buffer (an
    allgather's buffer holds every rank's part), run by the registered schedule
    ``collective``/``algo`` with ``params``. ``what`` names what travels ("gradient", "P",
    "Q", "entries", "payload")."""

    collective: str
    algo: str
    count: int
    itemsize: int
    what: str
    params: dict = field(default_factory=dict, compare=False)
    dtype: torch.dtype | None = None  # what a reduction adds in (None: bytes, or fp32)

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @property
    def schedule_params(self) -> dict:
        """The schedule's parameters with the element size, as gradwire's collectives run it
        (an algorithm that chooses blocks in bytes reads ``itemsize``)."""
        return {"itemsize": self.itemsize, **self.params}

    def schedule(self, world: int) -> Schedule:
        return registry.schedule(self.collective, self.algo, world, self.count,
                                 **self.schedule_params)

    def table(self, world: int, cached: bool = True) -> Table:
        """:func:`~gradwire.schedules.registry.table` of this call (``cached=False``: built
        afresh and not kept)."""
        return registry.table(self.collective, self.algo, world, self.count, cached=cached,
                              **self.schedule_params)


@dataclass(frozen=True)
class BucketPlan:
    """Everything one bucket's aggregation sends: ``calls`` in the order they run, and
    ``sent``, the bytes of this rank's payload (what it contributes, before the collectives
    forward anything). ``dense``: the method sends the bucket uncompressed (nothing would be
    dropped, or the compressed form would be no smaller)."""

    calls: tuple[CollectiveCall, ...]
    sent: int
    dense: bool = False

    def bytes_sent(self, world: int) -> np.ndarray:
        """Bytes each rank sends in this bucket's calls, counted from their schedules."""
        sent = np.zeros(world, dtype=np.int64)
        for c in self.calls:
            sent += c.table(world).sent() * c.itemsize
        return sent


def allreduce_algo(algo: str | None) -> tuple[str, dict]:
    """The allreduce a hook runs for ``algo`` (its ``algo=``): None is torch.distributed's own
    (gloo's ring, which gradwire's ring without pipelining prices and replays); a name is that
    gradwire schedule with its default parameters."""
    return ("ring", {"pipeline": 1}) if algo is None else (algo, {})


def allgather_algo(algo: str | None) -> tuple[str, dict]:
    """The allgather a hook runs: torch.distributed's own (None), else gradwire's ring."""
    return ("ring", {"pipeline": 1}) if algo is None else ("ring", {})


def dense(numel: int, dtype: torch.dtype, algo: str | None) -> BucketPlan:
    """The bucket as it is, summed by one allreduce: 4n bytes for fp32 (what DDP sends)."""
    name, params = allreduce_algo(algo)
    call = CollectiveCall("allreduce", name, numel, dtype.itemsize, "gradient", params, dtype)
    return BucketPlan((call,), numel * dtype.itemsize, dense=True)
