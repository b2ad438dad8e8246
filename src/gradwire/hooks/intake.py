"""Where DDP's buckets come into a hook state (:meth:`Intake.on_bucket`): each named by its
parameters' positions and sent on (issued from the hook, handed to the comm thread, or held
for the whole model), its future completed once, an error kept for ``backward()``; and, at the
end of the backward, what DDP left in no gradient given back to the residuals."""

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gradwire.catalogue import AggregationCall
from gradwire.errors import GradwireError
from gradwire.hooks import layout
from gradwire.hooks.comm import Comm, Worker, after_backward, complete
from gradwire.syncfree import on_host

DENSE_ONLY = ("gradwire's hooks need dense gradients: build embeddings with sparse=False "
              "(nn.Embedding, nn.EmbeddingBag)")


def _views(grad: torch.Tensor | None, buf: torch.Tensor) -> bool:
    """Whether ``grad`` lies in ``buf``'s memory (DDP's ``gradient_as_bucket_view=True``): the
    average written into the bucket is then the gradient, used or not."""
    return grad is not None and grad.untyped_storage().data_ptr() == (
        buf.untyped_storage().data_ptr())


class Intake:
    """:class:`~gradwire.hooks.state.HookState`'s intake of DDP's buckets; the fields it reads
    and writes are the state's (see its ``__init__``)."""

    def on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """What :func:`~gradwire.hooks.state.hook` does with one bucket (see
        :class:`~gradwire.hooks.state.HookState`). Inside a backward an error raised here is
        kept for ``backward()`` to raise once DDP has finished it (:meth:`_refuse`): raised
        from a hook, an error leaves DDP mid-reduction, and every later backward fails."""
        buf, index, last = bucket.buffer(), bucket.index(), bucket.is_last()
        if index == 0:  # a backward starts
            self._begin()
        fut: torch.futures.Future = torch.futures.Future()
        try:
            return self._take(bucket, buf, index, last, fut)
        except BaseException as e:  # a KeyboardInterrupt too: DDP must finish the backward
            if not self._errors.armed:
                raise
            return self._refuse(e, buf, last, fut)

    def _begin(self) -> None:
        """A backward starts: forget what one that did not finish left."""
        self._pending = []  # model mode: left over from a backward that did not finish
        self._held = []
        if self._step_open or self._errors.failed:  # agree on the buckets afresh
            self._layouts = None
        self._step_open = False  # the comm thread is done with every earlier step
        self._flights = []
        self._slots = []
        self._averaged = set()
        if self.ef is not None:  # before the deferred error is raised, which ends the backward
            after_backward(self._reclaim)
        self._errors.begin()
        self._direct_step = self._errors.armed and not self._density_moves

    def _refuse(self, error: BaseException, buf: torch.Tensor, last: bool,
                fut: torch.futures.Future) -> torch.futures.Future:
        """``fut``, completed with the bucket as it is, where the hook itself failed on it;
        ``error`` is raised by ``backward()`` once DDP has finished it. Handed to the comm
        thread in bucket order, so the buckets handed over before it are aggregated as ever
        and those after it are not (no rank then issues a collective another skips); at the
        step's last bucket, with every bucket still waiting for it."""
        self._direct_step = False  # the step's later buckets go to the guard, which skips them
        futures, buffers = [fut], [buf]
        if last:
            waiting = [(b, f) for b, _, f in self._pending] + self._held
            self._pending, self._held = [], []
            futures += [f for _, f in waiting if f is not fut]
            buffers += [b for b, f in waiting if f is not fut]

        def refused() -> list[torch.Tensor]:
            try:  # in bucket order: those started before it are averaged (_finish_started)
                self._finish_started()
            finally:
                self._errors.keep(error, buffers)
            return buffers

        self._dispatch(refused, futures, buffers, last)
        return fut

    def _take(self, bucket: dist.GradBucket, buf: torch.Tensor, index: int, last: bool,
              fut: torch.futures.Future) -> torch.futures.Future:
        comm = self._setup()
        if buf.layout != torch.strided:
            raise GradwireError(f"hooks: bucket {bucket.index()} holds sparse gradients; "
                                f"{DENSE_ONLY}")
        key = self.positions.layout(bucket.parameters())
        if self.positions.size(key) != buf.numel():
            raise GradwireError(f"bucket {bucket.index()} has {buf.numel()} elements, its "
                                f"parameters {self.positions.size(key)}: gradwire hooks need "
                                "dense gradients")
        call = AggregationCall(self.config.method, comm, self.compressor, self.ef, self.density,
                               dense=self.config.warmup.dense(self.step), name=self.call_name,
                               shapes=self.positions.shapes_of(key), caller=self.caller)
        if self.ef is not None:
            self._slots.append((buf, key, list(bucket.parameters())))
        if self.config.mode == "bucket":
            direct = self._issue(buf, key, call, index, last, fut)
            if direct is not None:
                return direct
            if on_host(buf):
                self._dispatch(lambda: [self._bucket(buf, key, call, index, last)], [fut],
                               [buf], last)
                return fut
            # On a device every future waits for the last bucket (HookState's docstring).
            self._held.append((buf, fut))
            held: list[torch.Tensor] = []  # the buffers the last bucket's task completes
            futures: list[torch.futures.Future] = []
            if last:
                held, futures = [b for b, _ in self._held], [f for _, f in self._held]
                self._held = []

            def task() -> list[torch.Tensor]:
                self._bucket(buf, key, call, index, last)
                return held

            self._dispatch(task, futures, held, last)
            return fut
        if index == 0 and last and self._resume_order is None and key == self._order:
            # one bucket in the order of the last whole-model aggregation: the bucket mode's
            # aggregation of it, so dense, fp16, bf16 and int8 are issued from the hook here too
            direct = self._issue(buf, key, call, index, last, fut)
            if direct is not None:
                return direct
        self._pending.append((buf, key, fut))
        if last:
            pending, self._pending = self._pending, []
            self._dispatch(lambda: self._model(pending, call), [f for *_, f in pending],
                           [b for b, *_ in pending], last)
        return fut

    def _reclaim(self) -> None:
        """At the end of a backward, once DDP has written the averages into the gradients:
        DDP leaves the gradient of a parameter that no rank used in this backward
        (``find_unused_parameters=True``, ``static_graph=True``) as it was, None, so what the
        average credited it goes back into the residual (each rank adds the average: summed
        over ranks, the P times the average the residuals gave up); no mass is lost. A
        gradient already there (``zero_grad(set_to_none=False)``) that is no view of the
        bucket is left as it was too: where it does not hold the average, the average goes
        back (element-wise, no host read; DDP copied it into every used one): one pass over
        the step's gradients, only for a DDP with ``find_unused_parameters`` or
        ``static_graph`` and without ``gradient_as_bucket_view``, which needs none (a hook
        registered with ``register_comm_hook`` itself sees none of DDP's options: every
        gradient that is no view of its bucket is compared). In a
        step that failed too (it runs before the error is raised), for the buckets that were
        averaged: a bucket completed as it was holds no average."""
        slots, self._slots = self._slots, []
        # registered with register_comm_hook itself (DDP's options unknown): any gradient that
        # is no view of its bucket may be one DDP left as it was
        unknown = self._stale_unused is None
        if self.ef is None or not (self._stale_unused or unknown
                                   or any(p.grad is None for _, _, ps in slots for p in ps)):
            return
        numels, residuals = self.positions.numels, self.ef.residuals
        found = layout.where(residuals, numels)
        unaveraged = {id(b) for b in self._errors.unaveraged} - self._averaged
        for buf, key, params in slots:
            if id(buf) in unaveraged:
                continue
            offset = 0
            for pos, p in zip(key, params, strict=True):
                n = numels[pos]
                stale = self._stale_unused or (unknown and not _views(p.grad, buf))
                if pos in found and (p.grad is None or stale):
                    held, at = found[pos]
                    avg, kept = buf[offset : offset + n], residuals[held][at : at + n]
                    if p.grad is not None:  # only where DDP did not copy the average in
                        g = torch.view_as_real(p.grad) if p.grad.is_complex() else p.grad
                        if p.is_contiguous():
                            g = g.reshape(-1)
                        else:  # element by element as DDP copied them: the bucket holds a
                            # dense parameter in its memory order (channels_last, transposed)
                            strides = layout.bucket_strides(
                                torch.view_as_real(p.detach()) if p.is_complex() else p)
                            avg = avg.as_strided(g.shape, strides)
                            kept = kept.as_strided(g.shape, strides)
                        avg = avg.where(g.ne(avg) & ~(g.isnan() & avg.isnan()), 0)
                    kept.add_(avg)
                offset += n

    def _setup(self) -> Comm:
        if self._comm is None:
            if not dist.is_initialized():
                raise GradwireError("torch.distributed is not initialized: call "
                                    "dist.init_process_group() before the first backward")
            c = self.config
            self._comm = Comm(c.group, c.algo, transport=c.method.path.on_transport)
            if c.method.per_rank_seed and self.compressor is not None:
                self.compressor.seed = c.seed * 2**20 + self._comm.rank
            if c.overlap:
                self._worker = Worker()
        return self._comm

    def _dispatch(self, task: Callable[[], list[torch.Tensor]],
                  futures: list[torch.futures.Future], buffers: list[torch.Tensor],
                  last: bool) -> None:
        """Run ``task`` (or hand it to the comm thread); ``buffers`` complete the futures, as
        they are, if it fails (:class:`~gradwire.hooks.comm.Deferred`)."""
        self._handed_over(last)
        guarded = self._errors.guard(task, buffers)

        def timed() -> list[torch.Tensor]:
            c0 = time.thread_time()
            try:
                return guarded()
            finally:
                self.stats["cpu"] += time.thread_time() - c0

        if self._worker is None:
            complete(timed, futures)
            return
        self._worker.submit(timed, futures)
        if last:
            # DDP issues collectives of its own on the group once the last bucket's hook has
            # returned (with find_unused_parameters=True, an allreduce of which parameters
            # were used); issued while the comm thread still issues the step's, they would
            # reach the ranks in different orders (gloo: "Received data size doesn't match",
            # or a hang). DDP waits for every bucket's future next, so this costs nothing.
            try:
                self._worker.drain()
            except BaseException as e:  # a KeyboardInterrupt: the futures are the task's now
                if not self._errors.armed:
                    raise
                self._errors.keep(e, [])

