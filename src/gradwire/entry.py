"""The ``gradwire`` command's entry point: the command line imported under a guard, so that a
Ctrl-C while torch and the commands load (seconds) ends in one line, as one later does, not in
the traceback of whatever import it stopped."""

from __future__ import annotations

import os
import sys


def closed_streams_to_null() -> None:
    """A stdout or stderr the caller closed (``gradwire run ... >&-``) is None in Python:
    the console made at import read ``sys.stdout.isatty()`` and failed with a traceback, and
    a rank's output line had nowhere to go. Each writes to os.devnull instead, as asked."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # open while the process lives


def main() -> None:
    closed_streams_to_null()
    try:
        from gradwire.cli import main as cli_main
    except KeyboardInterrupt:
        print("gradwire: interrupted by SIGINT", file=sys.stderr)
        sys.exit(130)
    cli_main()
