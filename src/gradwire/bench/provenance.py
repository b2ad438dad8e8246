"""Where and when a result was measured: one stamp for every benchmark and result file."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine(device: str = "cpu") -> str:
    """Host, architecture, cores, kernel, torch version (and the GPU's name for ``cuda``).
    The cores are those this process may run on (a container's or taskset's share), with the
    machine's count beside them where that is more."""
    where = f", GPU {torch.cuda.get_device_name()}{_nccl()}" if device == "cuda" else ""
    return (f"{platform.node()} {platform.machine()}, {_cores()}, Linux "
            f"{platform.release()}, torch {torch.__version__}{where}")


def _cores() -> str:
    total = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    cores = f"{usable} core{'s' if usable != 1 else ''}"
    return cores if usable is None or usable == total else f"{cores} (of {total})"


def _nccl() -> str:
    try:
        return ", NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return ""


def script_command(argv: list[str] | None = None) -> str:
    """How a benchmark script was run, as typed from the repository root:
    ``python benchmarks/<script> <its arguments>`` (``argv``: default ``sys.argv``)."""
    argv = sys.argv if argv is None else argv
    return shlex.join(["python", f"benchmarks/{Path(argv[0]).name}", *argv[1:]])


def stamp(command: str | None = None, device: str = "cpu") -> dict[str, str]:
    """``{"command": ..., "date": ..., "commit": ..., "machine": ...}`` (no command key when
    None): what every result file records of how and where it was made."""
    d = {"date": now(), "commit": commit(), "machine": machine(device)}
    return {"command": command, **d} if command is not None else d


def contention(worlds: tuple[int, ...], cores: int) -> str:
    """`` (CPU contention at P=4, P=8: more ranks than cores)``: the world sizes of ``worlds``
    whose ranks outnumber ``cores``, for a result's note (such figures are reported apart from
    those of a core per rank); "" where none does."""
    over = [p for p in worlds if p > cores]
    return (f" (CPU contention at {', '.join(f'P={p}' for p in over)}: more ranks than cores)"
            if over else "")


# What a result does not depend on: other results (a run that writes several files, or a
# session of runs, leaves the earlier ones changed) and the prose.
NOT_INPUTS = ("benchmarks/results", "docs", "README.md")


def commit(src: Path | None = None) -> str:
    """The git commit of the checkout at ``src`` (default: the one this package is imported
    from), with "+changes" when its tracked files differ from it, those of NOT_INPUTS aside;
    "unknown" outside git, and where git does not track ``src`` (a package installed in a
    virtual environment inside another project's checkout: that commit is not this code's)."""
    git = ["git", "-C", str(src or Path(__file__).resolve().parent)]
    inputs = [":/", *(f":(top,exclude){p}" for p in NOT_INPUTS)]
    try:
        tracked = subprocess.run([*git, "ls-files", "--", "."], capture_output=True,
                                 text=True).stdout.strip()
        if not tracked:
            return "unknown"
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--",
                                *inputs], capture_output=True, text=True).stdout.strip()
    except OSError:  # no git
        return "unknown"
    return head + ("+changes" if dirty else "") if head else "unknown"
