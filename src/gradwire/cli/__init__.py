"""The ``gradwire`` command line. Every user error ends in one line and a non-zero exit.

Each command parses its options, calls the library and prints; they live by group in
:mod:`.cluster` (``cluster up/down/status``, ``run``), :mod:`.train` (``models``, ``train``,
``demo``), :mod:`.bench` (``bench``, ``calibrate``), :mod:`.sim` (``trace``, ``simulate``) and
:mod:`.perf` (``profile``, ``whatif``, ``advise``), with the options and helpers they share in
:mod:`.options`. They are registered here, in the order ``gradwire --help`` lists them.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated

import typer

import gradwire


def closed_streams_to_null() -> None:
    """A stdout or stderr the caller closed (``gradwire run ... >&-``) is None in Python:
    the console made at import reads ``sys.stdout.isatty()`` and would fail with a
    traceback, and a rank's output line would have nowhere to go. Each writes to os.devnull
    instead, as asked."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # open while the process lives


closed_streams_to_null()  # before options makes its console from sys.stdout

from gradwire.cli import bench, cluster, perf, sim, train  # noqa: E402
from gradwire.cli.options import StrictCommand  # noqa: E402
from gradwire.errors import GradwireError  # noqa: E402
from gradwire.interrupts import Interrupted, on_signals  # noqa: E402

app = typer.Typer(help="gradwire: gradient aggregation on bandwidth-limited networks.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
cluster_app = typer.Typer(help="Emulated clusters: hosts in network namespaces, shaped links.",
                          no_args_is_help=True)
# One line each in `gradwire --help` (each command's own --help has its whole docstring).
SHORT_HELP = {
    "run": "Run CMD once per host with torchrun's environment; stop all if one fails.",
    "models": "List the models `gradwire train --model` accepts, with their size and data.",
    "train": "Train data-parallel on an emulated cluster: throughput, bytes, time, accuracy.",
    "demo": "Dense vs Top-k vs gTop-k on 4 emulated hosts at 1 Gbit/s: one table, one figure.",
    "bench": "Time collectives like nccl-tests: results checked, the model's prediction beside.",
    "calibrate": "Measure α, β, γ, codec and CPU costs on a cluster, for whatif and advise.",
    "trace": "Record a compute trace (backward hooks on every parameter) or edit one.",
    "simulate": "Simulate PS, multicast, in-network aggregation and all-reduce from a trace.",
    "profile": "Measure a model's forward, backward and optimizer times; list the built-in ones.",
    "whatif": "Predict iteration time over workers and bandwidths, and the compression needed.",
    "advise": "Rank every aggregation scheme by predicted iteration time; say why it wins.",
}


def _print_version(value: bool) -> None:
    if value:
        print(f"gradwire {gradwire.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print gradwire's version and exit.")] = False) -> None:
    """gradwire: gradient aggregation on bandwidth-limited networks."""


app.add_typer(cluster_app, name="cluster")
# every command reads its number options as gradwire.check does (StrictCommand)
cluster_app.command("up", cls=StrictCommand)(cluster.up)
cluster_app.command("down", cls=StrictCommand)(cluster.down)
cluster_app.command("status", cls=StrictCommand)(cluster.status)
app.command(short_help=SHORT_HELP["run"], cls=StrictCommand,
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
            )(cluster.run)
for name, fn in (("models", train.models), ("train", train.train), ("demo", train.demo),
                 ("bench", bench.bench), ("calibrate", bench.calibrate),
                 ("trace", sim.trace_cmd), ("simulate", sim.simulate),
                 ("profile", perf.profile), ("whatif", perf.whatif), ("advise", perf.advise)):
    app.command(name, short_help=SHORT_HELP[name], cls=StrictCommand)(fn)


def _one_line(message: str) -> str:
    """``message`` on one line: line breaks that user text brought in are shown escaped."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _hint(e: typer.TyperException) -> str:
    """For an option bench does not know that nccl-tests has, what bench takes instead."""
    ctx, option = getattr(e, "ctx", None), getattr(e, "option_name", None)
    if ctx is None or option is None or ctx.command.name != "bench":
        return ""
    return bench.nccl_tests_hint(option)


def _interrupt(signum: int) -> None:
    raise Interrupted(signum)


def main() -> None:
    try:
        # SIGINT, SIGTERM, SIGHUP and SIGQUIT raise Interrupted, which typer lets through (it
        # turns a KeyboardInterrupt into a silent exit 130), so that cleanup runs and the line
        # below says so; a launch handles them itself while its ranks run.
        with on_signals(_interrupt):
            rc = app(standalone_mode=False)
    except Interrupted as e:
        print(f"gradwire: {e}", file=sys.stderr)
        sys.exit(e.exit_status)
    except GradwireError as e:
        print(f"gradwire: error: {_one_line(str(e))}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        # a file the checks up front could not foresee (a disk that filled, a folder removed),
        # or a full disk under a write that names none (a figure, a timeline)
        if e.filename is None and e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO,
                                                  errno.EROFS):
            raise
        where = "" if e.filename is None else f"{e.filename}: "
        print(f"gradwire: error: {_one_line(f'{where}{e.strerror or e}')}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):  # an interrupt that came another way (a prompt)
        print("gradwire: interrupted; cleaned up", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as e:
        # click's own usage errors (a value out of range, an unknown option or command): one line
        # like ours instead of a usage box. With no arguments, typer has printed the help.
        if type(e).__name__ != "NoArgsIsHelpError":
            print(f"gradwire: error: {e.format_message()}{_hint(e)}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))
    if isinstance(rc, int) and rc != 0:
        sys.exit(rc)
