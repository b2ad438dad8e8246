"""One bucket whose collectives were issued straight from DDP's hook, until its future is
completed once: by the collectives' callback, by the end of the step, or by the comm
thread's dense fallback."""

import threading
import time

import torch

from gradwire.catalogue import Issued
from gradwire.compress.feedback import Status
from gradwire.syncfree import on_host


class Flight:
    """One bucket issued from the hook (``HookState._issue``): its future (None on a device
    where the collective's own is chained) completed once, by the collectives' callback (on
    the host), by ``HookState._settle``, or, where the ranks' status needs the policy's dense
    fallback, by the comm thread (:meth:`fall_back`)."""

    def __init__(self, buf: torch.Tensor, issued: Issued,
                 fut: torch.futures.Future | None, issued_at: float) -> None:
        self.buf, self.issued, self.fut, self.issued_at = buf, issued, fut, issued_at
        self.landed_at = issued_at  # when the collectives completed
        self.finishing = 0.0  # seconds in issued.finish()
        self.error: Exception | None = None
        self.fallback = 0  # the ranks' worst status, where it is not OK
        self._lock = threading.Lock()
        self._done = False
        self._landed = threading.Event()  # the callback has run (on the host)
        if fut is None or not on_host(buf):
            self._landed.set()

    def land(self, worst: int = 0) -> torch.Tensor | None:
        """The average, once the collectives are in, for the ranks' ``worst`` status; None
        where that is not OK (:meth:`fall_back` then)."""
        self.landed_at = time.perf_counter()
        try:
            if worst != Status.OK:
                self.fallback = worst
                return None
            return self.issued.finish(worst)
        finally:
            self.finishing = time.perf_counter() - self.landed_at

    def finish(self, worst: int) -> None:
        """:meth:`land`, and the future completed with the average (unless a fallback is due);
        an error is kept for ``HookState._settle``."""
        with self._lock:
            if self._done:
                return
            try:
                value = self.land(worst)
            except Exception as e:  # kept for _settle, which raises it from backward
                self.error, value = e, self.buf
            if value is None:
                return
            self._done = True
        assert self.fut is not None
        self.fut.set_result(value)

    def landed(self, collective: torch.futures.Future) -> None:
        """Callback of the collectives' futures (on a gloo thread): complete the bucket's,
        unless :meth:`complete` gave up on them first (then the bucket is no longer ours)."""
        try:
            try:
                for one in collective.value():
                    one.value()  # raises the collective's error
                worst = self.issued.read()
            except Exception as e:
                with self._lock:
                    self.error = e
                self.complete(self.buf)
                return
            self.finish(worst)
        finally:
            self._landed.set()

    def wait_landed(self) -> None:
        """Until the callback has run (the collectives are known to be in)."""
        self._landed.wait()

    def fall_back(self) -> list[torch.Tensor]:
        """The policy's dense path for the ranks' status (one more allreduce): the comm
        thread's task, the average written into the bucket."""
        avg = self.issued.finish(self.fallback)
        if avg is not self.buf:
            self.buf.copy_(avg)
        return [self.buf]

    def complete(self, value: torch.Tensor) -> bool:
        """Set the future to ``value`` unless it is set already; whether it was set here."""
        with self._lock:
            if self._done or self.fut is None:
                return False
            self._done = True
        self.fut.set_result(value)
        return True
