"""SIGINT, SIGTERM, SIGHUP and SIGQUIT (as torchrun takes them): gradwire stops what it
started, cleans up, and says so.

The CLI turns each into :class:`Interrupted` (one line, exit status 128 + the signal's
number); a launch records them instead while its ranks run, stops every rank (they run in
sessions of their own, out of reach of a terminal's signals), then raises it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

# SIGQUIT (Ctrl-\\) too: its default, a core dump, left every rank running in its own session
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(BaseException):
    """One of :data:`STOP_SIGNALS` reached gradwire (during a launch: raised once every rank has
    been stopped).

    A BaseException, as KeyboardInterrupt is, so that ``finally`` blocks (an emulated
    cluster's teardown) run and ``except Exception`` lets it pass; not a KeyboardInterrupt,
    which typer turns into a bare exit 130. The CLI prints it as its one line, once every
    ``finally`` has run, and exits with :attr:`exit_status`. ``stopped``: ranks that were still
    running (None: the signal came before any rank was started).
    """

    def __init__(self, signum: int, stopped: int | None = None) -> None:
        self.signum, self.stopped = signum, stopped
        ranks = ("" if stopped is None
                 else f"stopped {stopped} rank{'' if stopped == 1 else 's'} and ")
        super().__init__(f"interrupted by {signal.Signals(signum).name}; {ranks}cleaned up")

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum


def exit_at_once(signum: int) -> None:
    """End gradwire now, in one line, with exit status 128 + ``signum``: for a signal that comes
    while nothing is built yet or once everything is removed (torch loading, the exit). Left
    to Python, a SIGTERM while torch loads kills gradwire without a word, and a Ctrl-C there
    can abort in torch's C++ (``terminate called after throwing an instance of
    'pybind11::error_already_set'``)."""
    flush()
    with contextlib.suppress(OSError):
        os.write(2, f"gradwire: interrupted by {signal.Signals(signum).name}\n".encode())
    os._exit(128 + signum)


def flush() -> None:
    """Flush stdout and stderr, whatever state they are in."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or a pipe whose reader left
            stream.flush()


@contextlib.contextmanager
def on_signals(handler: Callable[[int], None],
               signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Call ``handler(signum)`` on ``signals`` within the block, then restore.

    A signal set to be ignored stays ignored (``nohup``'s SIGHUP, SIGINT in a background job
    of a script); outside the main thread, where Python takes no handlers, nothing changes.
    """
    old: dict[int, object] = {}
    try:
        # within the try, each old handler kept before its replacement is set: a signal that
        # comes while the rest are set (its handler may raise) leaves none of them replaced
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                h = signal.getsignal(sig)
                if h is not signal.SIG_IGN:
                    old[sig] = h
                    signal.signal(sig, lambda signum, _frame: handler(signum))
        yield
    finally:
        _restore(old)


def _restore(old: dict[int, object]) -> None:
    """Set every handler of ``old`` back, then raise what a handler raised meanwhile.

    A signal that comes while they are set back runs the handler of its own signal, which may
    already be the old one, and raise: raised at once, it left the handlers after it replaced
    for good (a teardown's, which only notes a signal, swallowed every later Ctrl-C)."""
    todo = list(old.items())
    raised: BaseException | None = None
    tries = 0  # of todo[0]: one that fails for good (not a handler's raise) is given up
    while todo:
        try:
            while todo:
                sig, h = todo[0]
                signal.signal(sig, signal.SIG_DFL if h is None else h)  # None: set outside Python
                del todo[0]
                tries = 0
        except BaseException as e:  # noqa: BLE001 - raised once every handler is back
            raised = raised or e
            tries += 1
            if tries > len(STOP_SIGNALS) + 1:
                del todo[0]
                tries = 0
    if raised is not None:
        raise raised
