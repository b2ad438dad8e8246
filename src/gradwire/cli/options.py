"""What several commands share: the console, option types, the cluster a command runs on, and
the checks and writes around their output files."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperCommand

from gradwire.bandwidth import UNSHAPED, format_bandwidth, parse_bandwidth
from gradwire.check import MAX_BATCH, MAX_SEED, check_range, number_text, parse_int
from gradwire.cluster import Cluster, ephemeral_cluster, load_cluster, netns_available
from gradwire.cluster.netns import LOOPBACK_LABEL, MTU
from gradwire.cluster.state import MAX_HOSTS, check_mtu
from gradwire.errors import GradwireError
from gradwire.interrupts import exit_at_once, on_signals
from gradwire.jobs import build_progress
from gradwire.jsonfile import check_writable, dumps, replace_text, save_elsewhere

# Piped output (CI logs, files) gets tables 120 columns wide (wide ones wrap their text
# cells) instead of 80 truncated columns, or $COLUMNS where it is set; a terminal's own
# width otherwise.
WIDTH = 120


def _piped_width() -> int:
    columns = os.environ.get("COLUMNS", "")
    # ASCII digits, read by parse_int: int() refused "²" (which str.isdigit() takes) and more
    # than 4300 digits with a ValueError, a traceback at import, before any command ran
    width = parse_int(columns) if columns.isascii() and columns.isdigit() else None
    return width if width is not None and width >= 40 else WIDTH


# No markup: what is printed holds paths, profiles' and traces' own words, whose "[...]" rich
# would drop (or fail on, "[/x]"); a line styled on purpose says markup=True, its words escaped.
console = Console(width=None if sys.stdout.isatty() else _piped_width(), markup=False)

Hosts = Annotated[int, typer.Option("--hosts", "-n", help="number of hosts (ranks), 1 to 250",
                                   min=1)]
Bandwidth = Annotated[str, typer.Option(
    "--bandwidth", "-b", help="per-host link rate in each direction, e.g. 100mbit, 2.5gbit, "
    f"25gbit (100kbit to 400gbit), or {' or '.join(UNSHAPED)} (unshaped)")]
Mtu = Annotated[int, typer.Option(
    help="largest IP packet on every link, bytes: 1500 (Ethernet) or e.g. 9000 (jumbo frames); "
    "tbf counts frame headers against the rate")]
Loopback = Annotated[bool, typer.Option(
    "--loopback", help=f"run without namespaces ({LOOPBACK_LABEL}); automatic without root")]
ClusterName = Annotated[str | None, typer.Option(
    "--cluster", help="use this live cluster (its hosts, bandwidth and MTU) instead of a new "
    "one; a --hosts, --bandwidth or --mtu given with it must match it")]

Model = Annotated[str, typer.Option(help="a model from `gradwire models`")]
Density = Annotated[float, typer.Option(help="fraction of gradient elements a sparsifier sends")]
Epochs = Annotated[int, typer.Option(help="epochs (1 to 10000)")]
# Bounds of two options many commands share. A seed goes to torch and numpy generators, and the
# data order seeds torch with seed × 1,000,003 + epoch, which must stay below 2**63. A batch of
# more than 65,536 samples per rank is a typo: the project's models would not fit a machine's
# memory with it, and torch fails with a traceback instead of a line.
# --seq-len: text models read windows of a 512 KiB corpus, whose 10 % test split holds few
# windows longer than 4096 symbols (none past ~52 K, and profiling then divided by zero).
BatchSize = Annotated[int, typer.Option(help="samples per rank per iteration (1 to 65536)")]
Seed = Annotated[int, typer.Option(help="model initialisation and data order (0 to "
                                   "2**32 - 1)")]
# Output paths are typed str, not Path: Path("out/") drops the "/" that says a folder was
# meant; check_outputs (check_writable) sees them as typed, and returns them as Paths.
JsonOut = Annotated[str | None, typer.Option("--json", help="write the result JSON here")]


class StrictCommand(TyperCommand):
    """A command whose number options take numbers as :mod:`gradwire.check` reads them:
    ASCII digits, no underscores. typer (pydantic) reads an int or float option's text as
    Python does (``1_0`` is 10, ``0_5`` is 5); here such a value is a usage error, one line,
    before typer converts it (and checks its min= and max=, with its own messages). "inf" and
    "nan" still reach the command, whose range check names the range. Every command is
    registered with this class (:mod:`gradwire.cli`).

    Once its options are read, a command loads torch before it runs (help and usage errors
    answer without it, in a fraction of a second): a stop signal while torch loads, or a
    KeyboardInterrupt from its import, ends gradwire at once in one line and 128 + the
    signal's number, as nothing is built yet; one inside torch's C++ import could abort it."""

    def invoke(self, ctx: typer.Context) -> object:
        with on_signals(exit_at_once):
            try:
                import torch  # noqa: F401
            except KeyboardInterrupt:
                exit_at_once(signal.SIGINT)
        return super().invoke(ctx)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            opts, _, _ = self.make_parser(ctx).parse_args(args=list(args))  # reads, sets nothing
            for param in self.params:
                kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
                given = opts.get(param.name) if kind in (int, float) else None
                for text in given if isinstance(given, (list, tuple)) else [given]:
                    if isinstance(text, str) and not number_text(text, whole=kind is int):
                        what = "a whole number" if kind is int else "a number"
                        text = text if len(text) <= 40 else text[:37] + "..."
                        raise typer.BadParameter(f"{text!r} is not {what} (ASCII "
                                                 "digits, no underscores)", ctx=ctx,
                                                 param=param)
        return super().parse_args(ctx, args)


def use_loopback(requested: bool) -> bool:
    """Whether to run on loopback: asked for, or (said on stderr) no namespaces here."""
    if requested:
        return True
    ok, why = netns_available()
    if not ok:
        print(f"gradwire: {why}; falling back to {LOOPBACK_LABEL}", file=sys.stderr)
    return not ok


def cluster_for(ctx: typer.Context, hosts: int, bandwidth: str, name: str | None,
                loopback: bool, mtu: int = MTU) -> contextlib.AbstractContextManager[Cluster]:
    """The live cluster ``name``, or an ephemeral one removed when the block ends. With a live
    cluster, a --hosts, --bandwidth or --mtu typed on the command line must match it (they
    would otherwise be ignored without a word)."""
    if name is not None:
        if loopback:
            raise GradwireError(f"--loopback and --cluster {name} ask for two networks: give "
                                "one of them")
        c = live_cluster(name)
        for key, given, have in (("hosts", hosts, len(c.hosts)), ("mtu", mtu, c.mtu),
                                 ("bandwidth", parse_bandwidth(bandwidth), c.bandwidth_bps)):
            if typed(ctx, key) and given != have:
                shown = (f"{have} hosts" if key == "hosts" else f"MTU {have}" if key == "mtu"
                         else f"{format_bandwidth(have)} links")  # type: ignore[arg-type]
                raise GradwireError(f"--{key} {ctx.params[key]} does not match cluster "
                                    f"{c.name} ({shown}): leave --{key} out with --cluster")
        return contextlib.nullcontext(c)
    check_loopback(ctx, loopback, bandwidth)
    return ephemeral_cluster(hosts, bandwidth, use_loopback(loopback), mtu,
                             progress=build_progress(console, hosts))


def check_loopback(ctx: typer.Context, loopback: bool, bandwidth: str) -> None:
    """A link rate or MTU typed with --loopback is refused: loopback shapes nothing and has
    its own MTU, so they were ignored without a word (the table's title said so, after the
    run). An unshaped --bandwidth (none, unlimited) is what loopback is, and is taken."""
    if not loopback:
        return
    if typed(ctx, "bandwidth") and parse_bandwidth(bandwidth) is not None:
        raise GradwireError(f"--bandwidth {bandwidth} shapes the emulated hosts' links; "
                            f"--loopback runs without them ({LOOPBACK_LABEL}): give one of "
                            "them")
    if typed(ctx, "mtu"):
        check_mtu(ctx.params["mtu"])  # a value no link takes is said as such first
        raise GradwireError(f"--mtu {ctx.params['mtu']} sets the emulated hosts' links' MTU; "
                            f"--loopback runs without them ({LOOPBACK_LABEL}): give one of "
                            "them")


def typed(ctx: typer.Context, name: str) -> bool:
    """Whether the option of parameter ``name`` was typed on the command line (not left to
    its default)."""
    return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"


def check_seq_len(ctx: typer.Context, model: str, seq_len: int) -> None:
    """A --seq-len typed for a model that reads no text is refused, as any option the run
    would not read: accepted, it was silently ignored."""
    from gradwire.models import get_spec

    data = get_spec(model).data
    if data != "text" and typed(ctx, "seq_len"):
        raise GradwireError(f"--seq-len {seq_len} sets a text model's symbols per sample: "
                            f"{model} reads {data}; leave it out")


def check_sparsifier_options(ctx: typer.Context, agg: str, warmup: bool) -> None:
    """--density or --warmup typed for a method that selects no elements (it sends them all,
    or compresses them otherwise) is refused, as any option the run would not read: accepted,
    they were silently ignored."""
    from gradwire import catalogue

    if catalogue.get(agg).takes_density:
        return
    given = [o for o, used in (("--density", typed(ctx, "density")),
                               ("--warmup", warmup and typed(ctx, "warmup"))) if used]
    if given:
        sparsifiers = ", ".join(n for n, m in catalogue.METHODS.items() if m.takes_density)
        raise GradwireError(f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} the "
                            f"fraction of the elements a sparsifier sends ({sparsifiers}): "
                            f"--agg {agg} selects none; leave "
                            f"{'it' if len(given) == 1 else 'them'} out")


def live_cluster(name: str) -> Cluster:
    """The live cluster ``name``, refused while ``cluster up`` is still making its hosts (a run
    would get fewer ranks than it was made for, or none), and refused when it is stale (a run's
    ephemeral cluster whose run died, or one whose namespaces are gone: the next cluster made
    on the machine removes it, under whatever runs on it then)."""
    c = load_cluster(name)
    if not c.ready:
        raise GradwireError(f"cluster {name} is still being built, or its build stopped half "
                            f"way: wait for `gradwire cluster up`, or `gradwire cluster down "
                            f"{name}`")
    why = c.why_stale
    if why:
        raise GradwireError(f"cluster {name} is stale ({why}) and the next "
                            f"cluster made will remove it: `gradwire cluster down {name}`, then "
                            f"`gradwire cluster up` one to keep")
    return c


def planned_ranks(hosts: int, name: str | None) -> int:
    """The ranks a command will run, known before any cluster is made: the live cluster
    ``name``'s hosts, or ``hosts`` once it is in range."""
    if name is not None:
        return len(live_cluster(name).hosts)
    if not 1 <= hosts <= MAX_HOSTS:
        raise GradwireError(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    return hosts


def check_seed_and_batch(seed: int, batch_size: int | None) -> None:
    """``--seed`` and ``--batch-size`` (None: not given) within their bounds."""
    check_range("--seed", seed, 0, MAX_SEED)
    if batch_size is not None:
        check_range("--batch-size", batch_size, 1, MAX_BATCH)


def check_outputs(*options: tuple[str, str | Path | None],
                  inputs: Iterable[tuple[str, str | Path | None]] = ()) -> list[Path | None]:
    """Refuse, before any work, output paths that cannot be written (or that name a folder,
    "out/": each path as typed, a str), a figure whose name gives no format matplotlib
    writes, one file named by two options, and an output that is a file the command reads
    (``inputs``: each option with its path, or with a name that is no file here, such as a
    built-in profile's), which the result would replace (one line each). The outputs'
    paths, as :func:`check_writable` returns them (Paths, None for None), in their order."""
    seen: dict[Path, str] = {}
    checked: list[Path | None] = []
    for option, typed_path in options:
        path = check_writable(typed_path, option)
        checked.append(path)
        if path is None:
            continue
        if option == "--plot":
            check_figure(path)
        # realpath, not abspath: a name through a link to the other's file or folder is the
        # same file, and one option's write went through the link over the other's
        same = seen.setdefault(Path(os.path.realpath(path)), option)
        if same != option:
            raise GradwireError(f"{same} and {option} name the same file, {str(path)!r}: one "
                                "would overwrite the other")
    for source, read in inputs:
        if read is None or not os.path.isfile(read):
            continue
        for (option, _), path in zip(options, checked, strict=True):
            if path is not None and _same_file(path, read):
                raise GradwireError(f"{option} {str(path)!r} is the file {source} reads: the "
                                    "result would replace it; write it elsewhere")
    return checked


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one existing file (links and other spellings included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either is not there (an output not yet written)
        return False


def check_figure(path: Path) -> None:
    """``path``'s extension names a format matplotlib can write (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise GradwireError(f"--plot {str(path)!r}: name the figure's format by its extension, one "
                            f"of {', '.join('.' + f for f in sorted(formats))}")


def command_line() -> str:
    """This command as typed, for the result files that record it."""
    return "gradwire " + shlex.join(sys.argv[1:])


def write_json(path: Path, doc: object) -> None:
    """Write ``doc`` to ``path`` (indented, one newline at the end) and say so; as
    :func:`write_text` when it cannot."""
    write_text(path, dumps(doc, indent=1) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write a command's result to ``path`` and say so. The path was checked before the work
    (:func:`check_outputs`), but a disk can fill and a folder go during a long run: then the
    result goes to a new file (:func:`save_elsewhere`) and the command fails with one line,
    "could not write PATH (why); result saved to OTHER". A file that was there stays as it
    was: a regular file is written beside it and then renamed over it."""
    try:
        replace_text(path, text)
    except OSError as e:
        raise GradwireError(f"could not write {path} ({e.strerror or e}); "
                            f"{save_elsewhere(path, text)}") from None
    console.print(f"wrote {path}")
