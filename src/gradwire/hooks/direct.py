"""Buckets a hook state issues straight from DDP's hook, on the training thread, as PyTorch's
own hooks issue theirs (dense, fp16, bf16, and int8 once its step sizes are known), each a
:class:`~gradwire.hooks.flight.Flight` settled before DDP waits for its future."""

import time

import torch

from gradwire.catalogue import AggregationCall, issuer
from gradwire.hooks import layout
from gradwire.hooks.comm import before_ddp_finishes
from gradwire.hooks.flight import Flight
from gradwire.syncfree import on_host


class Direct:
    """:class:`~gradwire.hooks.state.HookState`'s buckets issued from the hook; the fields it
    reads and writes are the state's (see its ``__init__``)."""

    def _issue(self, buf: torch.Tensor, key: layout.Layout, call: AggregationCall,
               index: int, last: bool, fut: torch.futures.Future) -> torch.futures.Future | None:
        """The bucket's future, its allreduces issued here, on the training thread, as
        PyTorch's own hooks issue theirs: no hand-over to the comm thread and back, which cost
        3–11 % of an iteration on the digits MLP and ResNet-20 at 4 × 1 Gbit/s
        (benchmarks/results/ddp_hooks/direct_*.json). None, and nothing done, unless every
        bucket of the step so far went this way, this one matches the agreed list (it needs
        no header) and its method is torch.distributed allreduces with nothing waited for
        before or between them (:func:`gradwire.catalogue.issuer`: dense, fp16, bf16, and
        int8 once the bucket has its step sizes).

        On the host the collectives' callbacks complete ``fut``, and :meth:`_settle` bounds the
        wait by GRADWIRE_TIMEOUT before DDP waits. On a device the future is the last
        collective's, chained as PyTorch's hooks chain theirs (NCCL's watchdog bounds it),
        unless the method's NaN/Inf status travels with its data (int8): then :meth:`_settle`
        reads every such bucket's status at once, the step's one read, and completes them.
        A status that needs the policy's dense fallback, another allreduce, has it issued from
        the comm thread, in bucket order, after the step's other collectives."""
        shape, trusted = self._agreed(buf, index)
        direct = self._direct_step and self._worker is not None and trusted
        path = issuer(call, buf, key) if direct else None
        if path is None:
            self._direct_step = False
            return None
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.ef is not None:
            self._carry("residuals", self.ef.residuals, key, buf)
        if self.config.momentum:
            self._correct(buf, key)
        issued = path.issue(call, buf, key)
        if index == 0:  # the step's first: settled before DDP finishes the backward
            self._step_open, self._observed = True, []
            before_ddp_finishes(self._settle)
        self._counted(key, shape, issued.sent, call.dense)
        self.stats["issued"] += 1
        self._handed_over(last)
        chained = not on_host(buf) and issued.worst is None
        flight = Flight(buf, issued, None if chained else fut, t0)
        self._flights.append(flight)
        self.stats["compress"] += time.perf_counter() - t0
        self.stats["cpu"] += time.thread_time() - c0
        if chained:
            return issued.flying[-1].work.get_future().then(lambda _: flight.land())
        if on_host(buf):
            collective = torch.futures.collect_all([f.work.get_future() for f in issued.flying])
            collective.add_done_callback(flight.landed)
        return fut

    def _settle(self) -> None:
        """The step's buckets issued from the hook, before DDP waits for their futures: on the
        host each is waited for within GRADWIRE_TIMEOUT; on a device those with a status are
        read at once and completed; so too where a later bucket of the step failed. A failure
        here completes the rest with their buckets as they are and is raised by
        ``backward()`` once DDP is done (:class:`~gradwire.hooks.comm.Deferred`). Buckets
        whose status needs the policy's dense fallback go to the comm thread, and are waited
        for. Then the step ends, unless the comm thread ends it (a later bucket of the step
        went there) or it failed."""
        flights, self._flights = self._flights, []
        comm, errors = self._comm, self._errors
        assert comm is not None
        held = [f for f in flights if f.fut is not None]
        try:
            # Waited for and finished even where a later bucket of the step failed: these were
            # issued before it, and each residual already keeps what its bucket sent
            for f in held:
                comm.wait(f.issued.flying)
                f.wait_landed()
            unread = [f for f in held if not on_host(f.buf)]
            if unread:
                # The step's one host read: every bucket's worst status at once.
                worsts = torch.stack([f.issued.worst() for f in unread]).tolist()  # type: ignore[misc]
                for f, worst in zip(unread, worsts, strict=True):
                    f.finish(worst)
        except BaseException as e:  # c10d's RuntimeError, a KeyboardInterrupt: DDP must finish
            errors.keep(e, [])
        fallbacks = []
        for f in held:
            if f.error is not None:
                errors.keep(f.error, [f.buf])
            if f.fallback and errors.error is None:
                fallbacks.append(f)
            elif f.complete(f.buf):  # nothing if it is complete already
                errors.unaveraged.append(f.buf)
        for f in flights:
            self.stats["compress"] += f.finishing
            self.stats["communicate"] += max(f.landed_at - f.issued_at, 0.0)
        for f in fallbacks:  # every rank has the same, in bucket order
            self._dispatch(f.fall_back, [f.fut], [f.buf], last=False)  # type: ignore[list-item]
        if fallbacks and self._direct_step:
            # the step ends once they are in (a fallback that fails fails the step, which is
            # then not counted); DDP waits for their futures next, so this costs nothing
            assert self._worker is not None
            try:
                self._worker.drain()
            except BaseException as e:  # a KeyboardInterrupt: the futures are the tasks' now
                errors.keep(e, [])
        if self._direct_step and errors.error is None:
            self._end_step()
