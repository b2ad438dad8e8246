"""Bytes between ranks: a thin, counting layer over torch.distributed point-to-point.

Every tensor goes on the wire as its raw bytes (a ``uint8`` view), so any dtype works on gloo
and NCCL alike and the counters measure exactly what was posted. Counters are per peer, in
bytes and in messages, so a cost model can be checked byte for byte and message for message.
"""

from __future__ import annotations

import contextlib
import datetime
import operator
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from gradwire import config
from gradwire.errors import GradwireError, PeerError

# torch ≥ 2.13 renames c10d's tensor collectives (the old names warn FutureWarning); older
# versions lack the new names. Same arguments: (output, input, ...).
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class P2P:
    """One point-to-point operation of a batch: send ``tensor`` to ``peer`` or receive into it."""

    op: Literal["send", "recv"]
    tensor: torch.Tensor
    peer: int


def as_wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 view, the way the transport sends them; a one-line
    error for a tensor whose bytes are not its values or cannot be viewed so."""
    if not isinstance(tensor, torch.Tensor):
        raise GradwireError(f"transport sends and receives torch tensors, got "
                            f"{type(tensor).__name__}")
    if tensor.is_quantized:  # its bytes lack its scale: c10d failed on it, named as the peer's
        raise GradwireError("transport sends plain tensors, got a quantized one: send its "
                            ".int_repr() (and scale and zero point) instead")
    if not tensor.is_contiguous():
        raise GradwireError("transport needs contiguous tensors: call .contiguous() first")
    # A conjugate or negative view (x.conj(), x.conj().imag) holds bytes that are not its
    # values: torch's dtype view refuses it with a traceback.
    for lazy, what, resolve in ((tensor.is_conj(), "conjugate", "resolve_conj"),
                                (tensor.is_neg(), "negative", "resolve_neg")):
        if lazy:
            raise GradwireError(f"transport needs tensors whose bytes are their values, got a "
                                f"{what} view: call .{resolve}() first")
    flat = tensor.reshape(-1)
    if flat.numel() <= 1 and flat.stride(0) != 1:
        # One element, or none, is contiguous whatever its stride (x[:, 0] of an x of one row
        # or none), and keeps it when flattened: the dtype view refused it with a traceback.
        flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8)


# Weak references (the world it was made in, the twin): c10d's registry owns both groups, and
# a strong reference here would outlive destroy_process_group and abort the process at exit.
_UPSTREAM: list[weakref.ref] = []


def is_default_group(group: object) -> bool:
    """Whether ``group`` is the default (world) group: None or ``dist.group.WORLD``."""
    return group is None or group is dist.group.WORLD


def _upstream_group(group: dist.ProcessGroup | None, backend: str, rank: int,
                    timeout: float) -> dist.ProcessGroup | None:
    """A second gloo group over the world, so each direction of a pair has its own connection.

    Gloo runs one TCP connection per pair and does not overlap a send and a receive on it: two
    ranks exchanging 64 MiB both ways at 1 Gbit/s got 0.48 Gbit/s each way on one connection,
    0.96 on two. Made once per process, on every rank's first Transport of the default group
    (every rank reaches it at the same point, as with any collective), waiting at most
    ``timeout`` seconds for the other ranks: c10d's own limit for a new gloo group is 30
    minutes, whatever the world's. NCCL and subgroups keep one connection per pair.
    """
    if not is_default_group(group) or backend != "gloo":
        return None
    world = dist.group.WORLD
    twin = _UPSTREAM[1]() if _UPSTREAM and _UPSTREAM[0]() is world else None
    if twin is None:
        try:
            twin = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as e:  # c10d's DistStoreError among them
            said = str(e)
            why = (f"timed out after {timeout:g} s: a rank failed or stalled before reaching "
                   "it (GRADWIRE_TIMEOUT sets the limit)"
                   if "timeout" in said.lower() or "timed out" in said.lower()
                   else f"failed: {said.splitlines()[0][-200:] if said else 'unknown error'}")
            raise GradwireError(f"rank {rank}: connecting to the other ranks, which every rank's "
                                f"first Transport (or gradwire collective) does, {why}") from None
        _UPSTREAM[:] = [weakref.ref(world), weakref.ref(twin)]
    return twin


def check_group(group: object, where: str) -> None:
    """A one-line error unless ``group`` is None (the default group) or a process group."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # an int (-100): "got -100" said nothing
        raise GradwireError(f"{where}: this rank is not in the group (dist.new_group gave it "
                            "GroupMember.NON_GROUP_MEMBER): only the group's ranks make its calls")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise GradwireError(f"{where}: group must be None (the default group) or a "
                            f"torch.distributed ProcessGroup (dist.new_group(...)), got "
                            f"{group!r}")


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where tensors of ``group``'s collectives must live: this rank's current GPU under NCCL,
    else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# What a peer that did not answer in time may have done, for a collective's messages.
LATE = "stalled, skipped this call, or its link is down (GRADWIRE_TIMEOUT sets the limit)"


class Pending:
    """A posted send or receive; ``wait()`` is bounded by ``timeout`` and raises
    :class:`PeerError` naming the peer when the operation fails or does not finish (``late``:
    what the peer may have done, where it did not answer in time)."""

    def __init__(self, work: dist.Work, op: str, peer: int, nbytes: int, rank: int,
                 timeout: float, late: str = LATE) -> None:
        self.work, self.op, self.peer, self.nbytes = work, op, peer, nbytes
        self.rank, self.timeout, self.late = rank, timeout, late

    def wait(self) -> bool:
        try:
            done = self.work.wait(datetime.timedelta(seconds=self.timeout))
        except RuntimeError as e:
            raise peer_error(self.rank, self.op, self.peer, self.nbytes, str(e),
                             self.timeout, self.late) from None
        if done is False:  # NCCL reports a timeout this way
            raise peer_error(self.rank, self.op, self.peer, self.nbytes, "timed out",
                             self.timeout, self.late)
        return True


def peer_error(rank: int, op: str, peer: int, nbytes: int, message: str,
               timeout: float, late: str = LATE) -> PeerError:
    """The :class:`PeerError` of a ``op`` ("send" or "recv") of ``nbytes`` with ``peer`` that
    failed with torch's ``message`` or did not finish within ``timeout`` seconds."""
    what = f"send of {nbytes} bytes to" if op == "send" else f"receive of {nbytes} bytes from"
    return PeerError(rank, peer, what, _why(message, peer, timeout, late))


def collective_error(rank: int, world: int, op: str, message: str, timeout: float,
                     during: str, late: str = LATE) -> GradwireError:
    """The error of a collective ``op`` (c10d's name: "barrier", "all_reduce", ...) over a
    world of ``world`` ranks that failed with torch's ``message`` or did not finish within
    ``timeout`` seconds, ``during`` a step of the caller's.

    Gloo does not say which rank a collective lost. In a world of two it can only be the
    other one: a :class:`PeerError` names it (``rank 1 in DURING: all_reduce with rank 0
    failed: ...``), in the form the launcher reads a lost peer from. In a larger world the
    GradwireError says that gloo does not tell.
    """
    if world == 2:
        peer = 1 - rank
        return PeerError(rank, peer, f"{op} with", _why(message, peer, timeout, late), during)
    return GradwireError(f"rank {rank} in {during}: {op} {_why(message, None, timeout, late)}")


def _why(message: str, peer: int | None, timeout: float, late: str) -> str:
    """Gloo's message, reduced to what happened (its first line names a C++ source file);
    ``peer`` None: a rank that gloo does not name."""
    low = message.lower()
    who, unnamed = (f"rank {peer}", "") if peer is not None else ("a rank",
                                                                 "; gloo does not say which")
    if "timed out" in low or "timeout" in low:
        return f"timed out after {timeout:g} s: {who} {late}{unnamed}"
    if "closed" in low or "reset" in low or "broken pipe" in low:
        return f"failed: the connection closed ({who} exited or was killed){unnamed}"
    return f"failed: {message.splitlines()[0][-200:] if message else 'unknown error'}"


class Transport:
    """Point-to-point messaging for one process group, with per-peer counters.

    Example::

        t = Transport()
        work = t.isend(x, dst=1)
        t.recv(y, src=1)
        work.wait()
        assert t.bytes_sent[1] == x.numel() * x.element_size()

    ``timeout``: seconds one wait may take (default ``GRADWIRE_TIMEOUT``, 60).
    ``check_calls``: collectives run over this transport first exchange a small header so
    that ranks making different calls all fail clearly (default ``GRADWIRE_CHECK_CALLS``, on;
    :mod:`gradwire.collectives.agree`).
    """

    def __init__(self, group: dist.ProcessGroup | None = None,
                 timeout: float | None = None, check_calls: bool | None = None) -> None:
        if not dist.is_initialized():
            raise GradwireError("torch.distributed is not initialized: call "
                                "dist.init_process_group() (gloo or nccl) first")
        check_group(group, "Transport")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = dist.get_backend(group)
        self.timeout = (config.check_timeout("timeout", timeout) if timeout is not None
                        else config.timeout())
        self.check_calls = config.check_calls() if check_calls is None else bool(check_calls)
        self._upstream = _upstream_group(group, self.backend, self.rank, self.timeout)
        # where this backend's point-to-point calls read and write (other backends: unchecked)
        self._device_type = {"gloo": "cpu", "nccl": "cuda"}.get(self.backend)
        self._control = False  # in a control() block; reset_counters leaves it as it is
        self.reset_counters()

    @property
    def device(self) -> torch.device:
        """Where this transport's tensors must live (:func:`group_device`). Buffers a
        collective makes for itself (headers) are made here."""
        return group_device(self.group)

    def _group_for(self, src: int, dst: int) -> dist.ProcessGroup | None:
        """Data from a lower to a higher rank uses ``group``; the other way, its twin."""
        return self.group if src < dst or self._upstream is None else self._upstream

    # counters -------------------------------------------------------------------------------
    def reset_counters(self) -> None:
        """Zero the per-peer counters of data, and ``control_bytes_sent`` (header exchanges,
        kept apart so that the data counters equal a schedule's traffic exactly). A control
        block in flight (an async call's header exchange) goes on counting as control."""
        p = self.world_size
        self.bytes_sent = [0] * p
        self.bytes_received = [0] * p
        self.messages_sent = [0] * p
        self.messages_received = [0] * p
        self.control_bytes_sent = 0

    @contextlib.contextmanager
    def control(self) -> Iterator[None]:
        """Count what is sent in this block as control traffic, not data."""
        outer, self._control = self._control, True
        try:
            yield
        finally:
            self._control = outer

    def _count(self, op: str, nbytes: int, peer: int) -> None:
        if self._control:
            self.control_bytes_sent += nbytes if op == "send" else 0
        elif op == "send":
            self.bytes_sent[peer] += nbytes
            self.messages_sent[peer] += 1
        else:
            self.bytes_received[peer] += nbytes
            self.messages_received[peer] += 1

    # operations -----------------------------------------------------------------------------
    def _peer(self, peer: object) -> int:
        """``peer`` as an int, another rank of this group (an int or numpy integer, not a
        bool); a one-line error for anything else."""
        try:
            p = operator.index(peer)  # type: ignore[arg-type]  # int, numpy's integers
        except TypeError:
            p = None
        if p is None or isinstance(peer, bool) or not 0 <= p < self.world_size or p == self.rank:
            shown = repr(peer)
            shown = shown if len(shown) <= 40 and "\n" not in shown else type(peer).__name__
            raise GradwireError(f"rank {self.rank}: peer {shown} is not valid: expected another "
                                f"rank in 0..{self.world_size - 1}")
        return p

    def _global(self, peer: int) -> int:
        """``peer``, already checked (:meth:`_peer`), as the world's rank that c10d takes."""
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def check_device(self, tensor: torch.Tensor) -> None:
        """A one-line error unless this backend can send and receive ``tensor`` where it
        lives: gloo would read a GPU tensor's memory as host memory, and NCCL fails on a host
        tensor naming no cause."""
        if self._device_type is not None and tensor.device.type != self._device_type:
            raise GradwireError(f"rank {self.rank}: {self.backend} sends {self._device_type} "
                                f"tensors, got one on {tensor.device}: move it with "
                                f".to({self.device.type!r}) first")

    def _wire(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as bytes, refused where this backend cannot send it
        (:meth:`check_device`)."""
        buf = as_wire(tensor)
        self.check_device(tensor)
        return buf

    def _pending(self, work: dist.Work, op: str, peer: int, nbytes: int) -> Pending:
        return Pending(work, op, peer, nbytes, self.rank, self.timeout)

    def _post(self, op: str, buf: torch.Tensor, peer: int) -> Pending:
        """isend or irecv to ``peer``, already checked; gloo raises at once if the peer's
        connection is already closed."""
        g = self._global(peer)
        try:
            if op == "send":
                work = dist.isend(buf, dst=g, group=self._group_for(self.rank, peer))
            else:
                work = dist.irecv(buf, src=g, group=self._group_for(peer, self.rank))
        except RuntimeError as e:
            raise peer_error(self.rank, op, peer, buf.numel(), str(e), self.timeout) from None
        return self._pending(work, op, peer, buf.numel())

    def _start(self, op: str, tensor: torch.Tensor, peer: int) -> Pending | None:
        peer = self._peer(peer)
        buf = self._wire(tensor)
        if buf.numel() == 0:
            return None
        self._count(op, buf.numel(), peer)
        return self._post(op, buf, peer)

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending | None:
        """Post a send; returns its handle (None for an empty tensor, which sends nothing)."""
        return self._start("send", tensor, dst)

    def irecv(self, tensor: torch.Tensor, src: int) -> Pending | None:
        """Post a receive into ``tensor`` (None for an empty tensor). ``tensor`` must have the
        bytes the peer sends: gloo fills a larger buffer in part and says nothing (the
        collectives' schedules, agreed by the call header, always match)."""
        return self._start("recv", tensor, src)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        wait_all([self.isend(tensor, dst)])

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        wait_all([self.irecv(tensor, src)])

    def _checked(self, o: object) -> tuple[str, torch.Tensor, int]:
        """(op, bytes, peer) of one operation of a batch, or its one-line error."""
        if not isinstance(o, P2P) or o.op not in ("send", "recv"):
            got = repr(o.op) if isinstance(o, P2P) else type(o).__name__
            raise GradwireError(f"rank {self.rank}: a batch takes P2P operations, each 'send' "
                                f"or 'recv', got {got}")
        return o.op, self._wire(o.tensor), self._peer(o.peer)

    def batch(self, ops: Sequence[P2P]) -> list[Pending]:
        """Post several sends and receives at once (one NCCL group; gloo posts them in order).

        Every operation is checked before any is counted or posted (an op other than 'send'
        or 'recv', a bad peer or tensor), so that a batch refused leaves nothing posted or
        counted.
        """
        live = [c for c in map(self._checked, ops) if c[1].numel() > 0]
        if self.backend == "nccl" and live:
            p2p = [dist.P2POp(dist.isend if op == "send" else dist.irecv, buf,
                              self._global(peer), self.group) for op, buf, peer in live]
            # One work per op, or a single coalesced one (then named after the first op).
            try:
                works = dist.batch_isend_irecv(p2p)
            except RuntimeError as e:  # NCCL raises here once its communicator is aborted
                op, buf, peer = live[0]
                raise peer_error(self.rank, op, peer, buf.numel(), str(e),
                                  self.timeout) from None
            for op, buf, peer in live:
                self._count(op, buf.numel(), peer)
            return [self._pending(w, op, peer, buf.numel())
                    for w, (op, buf, peer) in zip(works, live, strict=False)]
        posted = []
        for op, buf, peer in live:
            self._count(op, buf.numel(), peer)
            posted.append(self._post(op, buf, peer))
        return posted


def resolve(transport: object, group: object, where: str) -> Transport:
    """``transport``, or a new Transport over ``group`` when it is None; a one-line error
    naming ``where`` for anything else."""
    if transport is None:
        check_group(group, where)
        return Transport(group)  # type: ignore[arg-type]
    if not isinstance(transport, Transport):
        raise GradwireError(f"{where}: transport must be None or a gradwire.transport.Transport"
                            f", got {transport!r}")
    # the call runs on the transport's group: a group= other than it was ignored, and the call
    # met whatever its ranks called next
    if group is not None and group is not transport.group and not (
            is_default_group(group) and is_default_group(transport.group)):
        raise GradwireError(f"{where}: group= and transport= name different process groups: "
                            "pass Transport(group) as transport=, or only one of them")
    return transport


def wait_all(works: Sequence[Pending | None]) -> None:
    """Wait for every posted operation (None entries were empty and are skipped)."""
    for w in works:
        if w is not None:
            w.wait()
