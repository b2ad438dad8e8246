"""Run a gradwire rank program on a cluster and read back what rank 0 wrote.

The one place that ties the launcher to a progress bar and to error reporting, so ``demo``,
``bench`` and ``calibrate`` all fail the same way: the last lines of the ranks' output, then
one line naming the rank that failed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gradwire.cluster import Cluster
from gradwire.cluster.netns import Progress as BuildProgress
from gradwire.errors import GradwireError
from gradwire.launcher import PROGRESS, launch


def run_ranks(cluster: Cluster, module: str, args: Sequence[str], label: str,
              timeout: float | None, console: Console, total: int | None = None,
              tick: str | None = None, ticked: list[str] | None = None) -> object:
    """Start ``python -m module args --out FILE`` on every host; return FILE's JSON.

    Progress comes from rank 0's ``GW_PROGRESS done total`` lines, or, with ``tick``, from
    counting rank 0 lines that start with ``tick`` against ``total``. It is a bar where the
    console is a terminal; where it is not (output piped or logged) and not quiet, a line on
    stderr at each quarter of the run, or at its end where it counts none. ``ticked``, a list,
    gets the rest of each such ``tick`` line as it comes: what was done before a failure.
    """
    with tempfile.TemporaryDirectory(prefix="gradwire-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", module, *args, "--out", str(out)]
        tail: collections.deque[str] = collections.deque(maxlen=40)
        lines = plain_progress(console, label)
        with _bar(console, label) as bar:
            task = bar.add_task(label, total=total)

            def sink(line: str) -> None:
                head, _, text = line.partition("] ")
                # the launcher right-aligns rank numbers to the widest: "[rank  0]" at 11 ranks
                first = head.startswith("[rank ") and head.removeprefix("[rank ").lstrip() == "0"
                counts = _progress(text) if first else None
                if counts is not None:
                    done, of = counts
                    bar.update(task, completed=done, total=of)
                elif tick and first and text.startswith(tick):
                    bar.advance(task)
                    if ticked is not None:
                        ticked.append(text.removeprefix(tick))
                else:
                    tail.append(line)
                    return
                if lines is not None:
                    t = bar.tasks[0]
                    lines.update(int(t.completed), None if t.total is None else int(t.total))

            res = launch(cluster, cmd, timeout=timeout, sink=sink)
        if res.returncode != 0 or not out.exists():
            for line in tail:
                console.print(line, markup=False, highlight=False)
            why = res.message if res.returncode != 0 else "rank 0 wrote no result"
            raise GradwireError(f"{label} failed: {why}")
        try:
            result = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:  # ValueError: JSON's and UTF-8's decoding errors
            raise GradwireError(f"{label} failed: rank 0's result is not valid JSON ({e})"
                                ) from None
        if lines is not None:
            lines.finish()
        return result


def _progress(text: str) -> tuple[int, int] | None:
    """(done, total) of a ``GW_PROGRESS done total`` line; None for any other line, one that
    only looks like it included (``GW_PROGRESS 3/10``, or a line another thread of the rank
    wrote into it): such a line is the rank's output, shown as such, where it had stopped
    the whole run with the ValueError of its parsing."""
    words = text.split()
    if len(words) != 3 or words[0] != PROGRESS:
        return None
    # at most 18 digits: int() refuses more than 4300, and that ValueError stopped the run
    if not all(w.isascii() and w.isdigit() and len(w) <= 18 for w in words[1:]):
        return None
    return int(words[1]), int(words[2])


def _bar(console: Console, label: str) -> Progress:
    """The progress bar a terminal shows (it draws nothing elsewhere): done of total, time."""
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


@contextlib.contextmanager
def local_progress(console: Console, label: str) -> Iterator[Callable[[int, int], None]]:
    """Progress of work this process does itself (``profile``'s and ``trace``'s iterations),
    shown as :func:`run_ranks` shows the ranks': a bar on a terminal, else quarter lines on
    stderr. Yields ``update(done, total)``."""
    lines = plain_progress(console, label)
    with _bar(console, label) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if lines is not None:
                lines.update(done, total)

        yield update
    if lines is not None:
        lines.finish()


# a cluster of this many hosts or more shows its build's progress: a host takes some tens of
# ms to make (ip, tc, sysctl), so a smaller one is up before a bar means anything
BUILD_PROGRESS_HOSTS = 32


def build_progress(console: Console, hosts: int) -> BuildProgress | None:
    """An emulated cluster's build progress (``cluster_up``'s ``progress``), shown as
    :func:`local_progress` shows its own; None for a cluster too small to need it."""
    if hosts < BUILD_PROGRESS_HOSTS:
        return None
    return lambda: local_progress(console, "cluster up")


def plain_progress(console: Console, label: str) -> _Quarters | None:
    """Progress as plain stderr lines where ``console`` draws none (output piped or logged,
    not quiet); None where it is a terminal (a bar or spinner shows it) or quiet."""
    return None if console.is_terminal or console.quiet else _Quarters(label)


class _Quarters:
    """Progress as plain lines on stderr, one as each quarter of the work is done:
    ``gradwire LABEL: DONE/TOTAL done (N s)``; ``gradwire LABEL: done (N s)`` at the end of a
    run that counted none; ``say`` for a step a run names itself."""

    def __init__(self, label: str) -> None:
        self.label, self.shown, self.start = label, 0, time.monotonic()

    def update(self, done: int, total: int | None) -> None:
        if not total or done * 4 // total <= self.shown:
            return
        self.shown = done * 4 // total
        self.say(f"{done}/{total} done")

    def finish(self) -> None:
        """A run that reported no progress of its own says when it is done."""
        if not self.shown:
            self.say("done")

    def say(self, what: str) -> None:
        print(f"gradwire {self.label}: {what} ({time.monotonic() - self.start:.0f} s)",
              file=sys.stderr, flush=True)
