"""The CLI's wide tables in one style: no column rules, units on a second header line, the
name columns first."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table


def wide_table(columns: Sequence[str], title: str | None = None, names: int = 1) -> Table:
    """A table whose first ``names`` columns (names, which are short) are left-aligned and
    never wrapped, and the rest (figures) right-aligned. Where a terminal is too narrow for a
    row, a cell wraps at its spaces, else folds onto another line: nothing is cut to "…"."""
    t = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < names else "right", no_wrap=i < names,
                     overflow="fold")
    return t
