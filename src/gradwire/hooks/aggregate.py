"""One aggregation of a hook state (compress, communicate, average) and the step it belongs
to: the residual and velocity it carries, the call headers it agrees on, the step's end; and
model mode, the whole model aggregated at once. It runs on the comm thread (in the hook with
``overlap=False``); buckets issued from the hook (:mod:`gradwire.hooks.direct`) share the step's
bookkeeping."""

import contextlib
import time
from dataclasses import replace

import torch

from gradwire.catalogue import AggregationCall, Started, start
from gradwire.catalogue.methods import header as call_header
from gradwire.errors import GradwireError
from gradwire.hooks import layout
from gradwire.syncfree import on_host


def one_dtype(dtypes: set[torch.dtype]) -> None:
    """Refuse model mode over buckets of several dtypes: it aggregates one flat tensor."""
    if len(dtypes) > 1:
        raise GradwireError("hooks: mode='model' needs every trained parameter in one dtype, "
                            f"got {sorted(str(d) for d in dtypes)}: use mode='bucket' (DDP "
                            "buckets each dtype apart)")


class Aggregation:
    """:class:`~gradwire.hooks.state.HookState`'s aggregations and the step they make up; the
    fields it reads and writes are the state's (see its ``__init__``)."""

    def _start(self, x: torch.Tensor, key: layout.Layout, call: AggregationCall,
               index: int) -> Started:
        """Compress and communicate one aggregation (the step's header first, at its first)."""
        comm, s = call.comm, self.stats
        before, header, t0 = comm.seconds, comm.header_seconds, time.perf_counter()
        if not self._step_open:
            self._step_open, self._observed = True, []
            # else every aggregation has a header of its own
            if self._layouts is not None and self._density_moves:
                comm.agree(self._step_call(call))
        shape, trusted = self._agreed(x, index)
        if self.ef is not None:
            self._carry("residuals", self.ef.residuals, key, x)
        moved = None
        if self.config.momentum:
            # the velocity moves only once the ranks agree on the call, as the residual does
            in_band = call.method.path.in_band(call.method)
            if in_band and not trusted:  # a header without a status: exchanged first
                comm.agree(call_header(call, x.numel(), x.dtype))
                trusted = True
            moved = self._correct(x, key, commit=in_band)  # else: the header comes in start
        started = start(call, x, key, check=not trusted)
        if moved is not None:
            self.velocities[key] = moved.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        spent = comm.seconds - before
        s["compress"] += time.perf_counter() - t0 - spent
        s["communicate"] += spent
        s["header"] += comm.header_seconds - header
        self._counted(key, shape, started.sent, call.dense)
        return started

    def _carry(self, name: str, held: dict[layout.Layout, torch.Tensor], key: layout.Layout,
               like: torch.Tensor) -> None:
        """:func:`layout.carry` for bucket ``key``, told whether ``held`` (``name``) was
        disjoint when last seen."""
        was = self._disjoint.pop(name, False)  # not known, should carry raise part way
        self._disjoint[name] = layout.carry(held, key, self.positions.numels, like,
                                            disjoint=was)

    def _correct(self, x: torch.Tensor, key: layout.Layout,
                 commit: bool = True) -> torch.Tensor | None:
        """Momentum correction (Lin et al. 2018, DGC §3.2), in place: u = m·u + x, then x = u,
        so what is compressed, with its residual, is this rank's velocity rather than its
        gradient, and the optimizer steps without momentum. A NaN or Inf is sent as it is (the
        NaN/Inf policy sees it) and its element's velocity restarts at zero. Four passes over
        the bucket, no host read. ``commit`` False: u is left as it was and the new velocity
        returned, for the caller to keep once the call is agreed (a new tensor)."""
        self._carry("velocities", self.velocities, key, x)
        u = self.velocities.get(key)
        if not commit:
            v = torch.zeros_like(x) if u is None else u * self.config.momentum
            x.copy_(v.add_(x))
            return v
        if u is None:
            u = self.velocities[key] = torch.zeros_like(x)
        u.mul_(self.config.momentum).add_(x)
        x.copy_(u)
        u.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return None

    def _agreed(self, x: torch.Tensor, index: int) -> tuple[tuple[int, str], bool]:
        """(x's elements and dtype, whether the step before agreed on them at ``index``: then
        its aggregation needs no header of its own)."""
        agreed, shape = self._layouts, (x.numel(), str(x.dtype).removeprefix("torch."))
        return shape, agreed is not None and index < len(agreed) and agreed[index] == shape

    def _counted(self, key: layout.Layout, shape: tuple[int, str], sent: int,
                 dense: bool) -> None:
        """One aggregation of this step made: its shape (the next step's agreed list), its
        layout (its PowerSGD memory kept), its bytes and counts in ``stats``."""
        self._observed.append(shape)
        self._used.add(key)
        s = self.stats
        s["sent"] += sent
        s["buckets"] += 1
        s["dense"] += dense

    def _handed_over(self, last: bool) -> None:
        """At the step's last bucket: the time its result waits from. The step is counted
        once it has ended (:meth:`_end_step`): a step that failed is not counted, so the
        warm-up and ``dense_steps`` count the iterations aggregated."""
        if last:
            self._handoff = time.perf_counter()

    @property
    def _density_moves(self) -> bool:
        """Whether a step can send another density than the step before on some rank: a
        density warm-up, which ``set_epoch`` moves on the rank that calls it. Everything
        else in a call's header is fixed once the first step agreed on it (the dense warm-up
        counts steps, which every rank takes together)."""
        return bool(self.config.warmup.densities) and self.config.method.takes_density

    def _step_call(self, call: AggregationCall) -> list[tuple[str, object]]:
        """The per-step header: what every rank's aggregations of this step must share."""
        buckets = ",".join(f"{n}:{d}" for n, d in self._layouts or ())
        return [("call", "hook step"), ("method", call.name), ("mode", self.config.mode),
                ("dense", call.dense), ("density", float(call.density)),
                ("buckets", buckets)]

    def _finish(self, x: torch.Tensor, started: Started, worst: int) -> None:
        """The average of one aggregation for the ranks' ``worst`` status, written into ``x``."""
        t0, before = time.perf_counter(), self._comm_seconds()
        avg = started.finish(worst)
        if avg is not x:  # the dense and sparse paths average in the bucket itself
            x.copy_(avg)
        spent = self._comm_seconds() - before
        self.stats["compress"] += time.perf_counter() - t0 - spent
        self.stats["communicate"] += spent

    def _comm_seconds(self) -> float:
        return self._comm.seconds if self._comm is not None else 0.0

    def _end_step(self) -> None:
        self.step += 1
        self.stats["steps"] += 1
        self.stats["tail"] += time.perf_counter() - self._handoff
        if self.compressor is not None and not self._loaded:  # what rebuilt buckets kept
            self.compressor.forget(self._used)  # (PowerSGD's Q, int8's step sizes, scratch)
        self._used, self._loaded = set(), False
        self._layouts, self._step_open = self._observed, False

    def _bucket(self, buf: torch.Tensor, key: layout.Layout, call: AggregationCall,
                index: int, last: bool) -> torch.Tensor:
        if index == 0:
            self._unfinished = []  # left by a step that failed
        try:
            started = self._start(buf, key, call, index)
        except BaseException:
            with contextlib.suppress(Exception):  # the error raised is the bucket's own
                self._finish_started()
            raise
        if started.worst is None or on_host(buf):
            self._finish(buf, started, started.read())
        else:
            self._unfinished.append((buf, started))
        if last:
            self._finish_started()  # the step's one host read
            self._end_step()
        return buf

    def _finish_started(self) -> None:
        """Every aggregation started and not finished yet (bucket mode on a device) finished:
        every bucket's worst status read at once, then each average written. At the step's
        last bucket, and where the step fails before it: the aggregations started before the
        failure have their messages in and their residuals keep what they sent, so they are
        averaged, as on the host (where each is finished as soon as its data is in); left
        as they were, DDP would write their gradients back as well (mass made)."""
        unfinished, self._unfinished = self._unfinished, []
        if not unfinished:
            return
        worsts = torch.stack([st.worst for _, st in unfinished]).tolist()  # type: ignore[misc]
        for (x, st), worst in zip(unfinished, worsts, strict=True):
            self._finish(x, st, worst)
            self._averaged.add(id(x))

    def _model(self, pending: list[tuple[torch.Tensor, layout.Layout, torch.futures.Future]],
               call: AggregationCall) -> list[torch.Tensor]:
        one_dtype({buf.dtype for buf, _, _ in pending})
        views: dict[int, torch.Tensor] = {}
        for buf, key, _ in pending:
            offset = 0
            for pos in key:
                n = self.positions.numels[pos]
                views[pos] = buf[offset : offset + n]
                offset += n
        order, self._resume_order = self._resume_order, None
        if order is None:
            order = pending[0][1] if len(pending) == 1 else tuple(sorted(views))
        elif sorted(order) != sorted(views):
            raise GradwireError("hook state_dict's model order names parameter positions "
                                f"{sorted(order)}, this model's are {sorted(views)}")
        if len(pending) == 1 and pending[0][1] == order:
            x = pending[0][0]  # aggregated where it lies: no copy in, none back
        else:
            x = torch.cat([views[p] for p in order])
        self._order = order
        call = replace(call, shapes=self.positions.shapes_of(order))
        started = self._start(x, order, call, 0)
        self._finish(x, started, started.read())  # the step's one read
        avg = x
        if avg is not pending[0][0]:
            offset = 0
            for p in order:
                views[p].copy_(avg[offset : offset + views[p].numel()])
                offset += views[p].numel()
        self._end_step()
        return [buf for buf, _, _ in pending]

