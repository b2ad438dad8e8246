"""The ``gradwire`` command's entry point: the command line imported under a guard, so that a
Ctrl-C while torch and the commands load (seconds) ends in one line, as one later does, not in
the traceback of whatever import it stopped."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from gradwire.cli import main as cli_main
    except KeyboardInterrupt:
        print("gradwire: interrupted by SIGINT", file=sys.stderr)
        sys.exit(130)
    cli_main()
