"""Agreement before data: every rank shows every other rank the call it is about to make.

Ranks that disagree on a collective (a different size, dtype, algorithm, density or root, or
one rank a call behind) would otherwise exchange messages of the wrong length (gloo aborts),
of the right length but the wrong meaning (a silently wrong result), or wait forever. Before
the data moves, each rank allgathers a fixed-size header of a few text fields describing its
call (recursive doubling: lg P messages, of at most P/2 headers, at P a power of two; at other
P, ⌊lg P⌋ + 2, the last of them all P headers). Every rank then holds
every header and raises the same :class:`MismatchError`, naming each field that differs and
which ranks hold which value. A rank that skipped the call is not there to answer: its peers'
header exchange times out naming it (:class:`~gradwire.errors.PeerError`).

The header also carries a one-digit status of this rank's data (0 when all is well; larger is
worse), and every rank learns the worst, so that all take the same path when one of them holds
NaN or Inf, or would overflow (the NaN/Inf policy, :mod:`gradwire.compress.feedback`).

A rank that refuses a call's arguments (a dtype no reduction takes, a tensor of the wrong size)
sends a header saying so in the same exchange (:func:`refuse`): the others then raise
:class:`RefusedError` at once, naming it and its reason, instead of waiting on it until the
timeout.

Cost: one extra latency per step, lg P·α (⌊lg P⌋ + 2 at P not a power of two); the header is
7 × 24 bytes. Measured in
docs/reliability.md. ``Transport(check_calls=False)`` or ``GRADWIRE_CHECK_CALLS=0`` turns it off
(the same setting on every rank, or the exchanges themselves disagree).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import torch

from gradwire.collectives.executor import execute
from gradwire.errors import GradwireError, PeerError
from gradwire.schedules import registry
from gradwire.transport import Transport

FIELD_BYTES = 24
FIELDS = 6  # compared; every header has this many, so exchanges have one size on every rank
STATUS = FIELDS  # one more slot, not compared: this rank's status digit, "0" when all is well

Call = Sequence[tuple[str, object]]  # (field name, value), at most FIELDS of them


class MismatchError(GradwireError):
    """Ranks made different collective calls; raised on every rank with the same fields."""


class RefusedError(GradwireError):
    """Another rank refused the call's arguments (:func:`refuse`); raised on the ranks that
    did not, naming each rank that refused and its reason."""


def _whole(value: object) -> str:
    return value if isinstance(value, str) else str(value).removeprefix("torch.")


def _text(value: object) -> str:
    s = _whole(value)
    b = s.encode()
    if len(b) <= FIELD_BYTES:
        return s
    # Long values (parameter lists) keep a readable head and a checksum of the whole: the head
    # cut in bytes, not characters (15 characters other than ASCII are more than 15 bytes, and
    # would run into the next field, over the checksum), and at a character's start.
    head = b[:FIELD_BYTES - 9].decode(errors="ignore")
    return f"{head}#{zlib.crc32(b):08x}"


def encode(call: Call, status: int = 0) -> torch.Tensor:
    """The header of ``call``: FIELDS + 1 slots of FIELD_BYTES bytes, zero-padded text; the
    last holds ``status``, one digit."""
    if len(call) > FIELDS:
        raise ValueError(f"a header has at most {FIELDS} fields, got {len(call)}")
    if status not in range(10):
        raise ValueError(f"a header's status is one digit, got {status!r}")
    raw = bytearray((FIELDS + 1) * FIELD_BYTES)
    for i, (_, value) in enumerate([*call, *[("", "")] * (FIELDS - len(call)),
                                    ("status", int(status))]):
        b = _text(value).encode()
        raw[i * FIELD_BYTES : i * FIELD_BYTES + len(b)] = b
    return torch.frombuffer(raw, dtype=torch.uint8).clone()


def decode(header: torch.Tensor) -> list[str]:
    raw = bytes(header.tolist())
    return [raw[i * FIELD_BYTES : (i + 1) * FIELD_BYTES].rstrip(b"\0").decode(errors="replace")
            for i in range(FIELDS + 1)]


def differences(call: Call, headers: list[list[str]]) -> list[str]:
    """For each field on which ranks differ: ``name: value on ranks a, b; other on rank c``,
    and this rank's value in full where the header holds it cut short (:func:`_text`)."""
    out = []
    for i, (name, value) in enumerate(call):
        by_value: dict[str, list[int]] = {}
        for r, h in enumerate(headers):
            by_value.setdefault(h[i], []).append(r)
        if len(by_value) > 1:
            parts = [f"{v or '?'} on rank{'s' if len(rs) > 1 else ''} "
                     f"{', '.join(map(str, rs))}" for v, rs in by_value.items()]
            whole = _whole(value)
            cut = f" (this rank's: {whole})" if _text(value) != whole else ""
            out.append(f"{name}: {'; '.join(parts)}{cut}")
    return out


HEADER_BYTES = (FIELDS + 1) * FIELD_BYTES
# A refusing rank's header: this byte where the status digit goes (above every digit, so the
# worst status read in every exchange shows a refusal), and its reason in the other bytes.
REFUSED = ord("R")
_MARK = STATUS * FIELD_BYTES


def _refusal(reason: str) -> torch.Tensor:
    """The header of a refused call: REFUSED, and ``reason``'s first line, cut to fit."""
    text = (reason.splitlines() or [""])[0].encode()
    if len(text) >= HEADER_BYTES:
        text = text[: HEADER_BYTES - 4].decode(errors="ignore").encode() + b"..."
    body = text.ljust(HEADER_BYTES - 1, b"\0")
    return torch.frombuffer(bytearray(body[:_MARK] + bytes([REFUSED]) + body[_MARK:]),
                            dtype=torch.uint8).clone()


def _refusals(rows: torch.Tensor) -> str:
    """``rank r refused it: reason`` for each refusing rank's header of ``rows``, ranks with
    one reason together."""
    by_reason: dict[str, list[int]] = {}
    for r, row in enumerate(rows.cpu()):
        raw = bytes(row.tolist())
        if raw[_MARK] == REFUSED:
            said = (raw[:_MARK] + raw[_MARK + 1:]).rstrip(b"\0").decode(errors="replace")
            by_reason.setdefault(said.removeprefix(f"rank {r}: "), []).append(r)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} refused it: "
                     f"{why}" for why, rs in by_reason.items())


def header_spec(world_size: int) -> tuple[str, str, int, dict[str, object]]:
    """(collective, algorithm, bytes, parameters) of one header exchange: the schedule
    :func:`agree` runs, and what the performance model charges for it."""
    return "allgather", "rd", world_size * HEADER_BYTES, {"itemsize": 1}


def agree(transport: Transport, call: Call,
          finite: bool | Callable[[], bool] = True) -> bool | None:
    """Raise :class:`MismatchError` on every rank unless every rank is making ``call``
    (:class:`RefusedError` where another rank refused it instead, :func:`refuse`).

    Returns whether every rank's ``finite`` was true (the same answer on every rank), or
    ``finite`` itself for one rank, or None when ``transport.check_calls`` is off (then no
    rank knows about the others). ``finite`` may be a function, called only when its answer
    is used: not with the check off. :func:`agree_status` carries more than a yes or no.
    """
    status = (lambda: int(not finite())) if callable(finite) else int(not finite)
    worst = agree_status(transport, call, status)
    return None if worst is None else worst == 0


def agree_status(transport: Transport, call: Call,
                 status: int | Callable[[], int] = 0) -> int | None:
    """As :func:`agree`, with a status digit (0–9, larger is worse) in place of a yes or no.

    Returns the largest ``status`` of any rank (the same answer on every rank), or this rank's
    own for one rank, or None when ``transport.check_calls`` is off. ``status`` may be a
    function (e.g. ``lambda: feedback.status(x, residual)``), called only when its answer is
    used: not with the check off.
    """
    p = transport.world_size
    if p > 1 and not transport.check_calls:
        return None
    mine_status = int(status() if callable(status) else status)
    if p == 1:
        return mine_status
    mine = encode(call, mine_status).to(transport.device)
    what = f"{call[0][1]}/{call[1][1]}"  # the call and its algorithm or method
    rows = _exchange(transport, mine, what)
    compared = len(call) * FIELD_BYTES  # the fields differences() names
    differ = (rows[:, :compared] != mine[:compared]).any().to(torch.uint8)
    # Both answers in one host read: on a GPU each read waits for the device.
    differs, worst = torch.stack([differ, rows[:, _MARK].max()]).tolist()
    if worst == REFUSED:  # decode only to explain
        raise RefusedError(f"rank {transport.rank}: no rank runs {what}: "
                           f"{_refusals(rows)}")
    if differs:  # decode only to explain
        headers = [decode(row) for row in rows.cpu()]
        raise MismatchError(f"rank {transport.rank}: ranks made different collective calls: "
                            f"{' | '.join(differences(call, headers))} (every rank must make "
                            "the same collective calls in the same order)")
    return worst - ord("0")


def refuse(transport: Transport, reason: str) -> None:
    """This rank's side of the header exchange of a call it refused before making it (an
    argument wrong here): its header carries ``reason``, so that every other rank raises
    :class:`RefusedError` at once, naming this rank and ``reason``, instead of waiting on it
    until the timeout. The caller raises its own error then; no data moves on any rank.

    Nothing is exchanged at P = 1, or with ``transport.check_calls`` off: then the other ranks
    wait on this one until the timeout (:class:`~gradwire.errors.PeerError`).
    """
    if transport.world_size > 1 and transport.check_calls:
        _exchange(transport, _refusal(reason).to(transport.device), "a refused call")


def _exchange(transport: Transport, mine: torch.Tensor, what: str) -> torch.Tensor:
    """Every rank's header, ``mine`` among them: one row per rank (see the module's notes)."""
    p, h = transport.world_size, mine.numel()
    collective, algo, count, params = header_spec(p)
    s = registry.schedule(collective, algo, p, count, **params)
    buf = torch.zeros(p * h, dtype=torch.uint8, device=mine.device)
    buf[transport.rank * h : (transport.rank + 1) * h] = mine
    try:
        with transport.control():
            execute(s, buf, transport)
    except PeerError as e:
        raise e.within(f"the header exchange before {what}") from None
    return buf.view(p, h)
