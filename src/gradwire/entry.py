"""The ``gradwire`` command's entry point. A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT)
that comes outside the command's own handling, while the command loads (seconds, where it
needs torch) or once it is done, ends gradwire at once in one line, with exit status 128 + the
signal's number, as one during the command does: nothing is being built or removed then.

Once the command is done gradwire exits without Python's teardown of its modules (half a
second with torch loaded): its threads are waited for, its ``atexit`` functions run and its
output is flushed, then the process ends. Python sets the signals back to their defaults
for that teardown, where a Ctrl-C would kill gradwire without a word, or be lost (exit
status 0)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

from gradwire.interrupts import exit_at_once, flush, on_signals


def _exit(status: object) -> None:
    """Exit as ``sys.exit(status)`` would, without the module teardown."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status & 0xFF
    else:  # sys.exit("text"): the text on stderr, status 1
        with contextlib.suppress(Exception):
            print(status, file=sys.stderr)
        code = 1
    for thread in threading.enumerate():  # as Python waits for them first
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # a stop signal meanwhile: exit_at_once
    flush()
    os._exit(code)


def main() -> None:
    # the command sets its own while it runs, then these back; _exit ends the process
    # inside the block, so they stay for the exit too
    with on_signals(exit_at_once):
        try:
            from gradwire.cli import main as cli_main
        except KeyboardInterrupt:  # raised by an import itself
            exit_at_once(signal.SIGINT)
        try:
            cli_main()
        except SystemExit as e:
            _exit(e.code)
        _exit(0)
