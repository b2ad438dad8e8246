"""The one exception type the CLI turns into a one-line message instead of a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class GradwireError(Exception):
    """A user-facing error: the message says what was wrong and what is allowed."""


def did_you_mean(name: object, known: object) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to ``name``, or ``""``."""
    import difflib

    hint = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """``table[name]``; an unknown name is a one-line error: ``unknown WHAT 'name' (did you
    mean 'x'?): expected one of ...``."""
    found = table.get(name)
    if found is None:
        raise GradwireError(f"unknown {what} {name!r}{did_you_mean(name, table)}: expected one "
                            f"of {', '.join(table)}")
    return found


class PeerError(GradwireError):
    """A send or receive that failed or timed out: names this rank, the peer and the operation.

    ``peer`` is the rank this one was waiting on; when a rank dies, its neighbours name it and
    ranks further away name the neighbour that stopped because of it.
    """

    def __init__(self, rank: int, peer: int, what: str, why: str, during: str = "") -> None:
        self.rank, self.peer, self.what, self.why, self.during = rank, peer, what, why, during
        where = f" in {during}" if during else ""
        super().__init__(f"rank {rank}{where}: {what} rank {peer} {why}")

    def within(self, during: str) -> PeerError:
        """The same error, saying which collective it happened in."""
        return PeerError(self.rank, self.peer, self.what, self.why, during)
