"""Time and traffic of a schedule, derived from its transfers alone (no per-algorithm formula).

Model (Hockney's α-β plus γ for reduction, full-duplex links, one port per rank):
a step costs, on each rank, ``max(α·m_out + β·b_out, α·m_in + β·b_in) + γ·b_reduced``, where
``m`` counts messages and ``b`` bytes sent, received or combined by that rank in the step; the
step takes as long as its slowest rank, and the schedule as long as its steps together.

Links shaped by a token bucket (``CostParams.burst`` bytes; the emulated cluster's ``tc tbf``,
0 on a plain link): each direction of a rank's link holds up to ``burst`` bytes of credit,
which passes at once, and earns credit at the link's rate (1/β bytes per second) whenever
it is not sending: while the rank pays α, reduces, or waits for the step's slowest rank. A
step then costs a rank ``max(α·m_out + β·max(0, b_out − c_out), α·m_in + β·max(0, b_in − c_in))
+ γ·b_reduced`` with c its credit at the start of the step, and after a step of T seconds the
credit is ``min(burst, c + T/β − b)``. Every link starts the schedule with ``start_credit``
bytes (what it earned idle before the call); :func:`back_to_back` instead carries each link's
credit from one call into the next, as when calls follow each other. With ``burst = 0`` this is
the Hockney step sum above, exactly. A pipelined schedule's links idle between its steps for
α, so a bucket of a few blocks lets each block leave at once: the emulated cluster's linear
pipeline runs at n·β, not at (n/b + P − 2)(α + b·β).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gradwire.check import check_real
from gradwire.config import DEFAULT_ALPHA_S
from gradwire.errors import GradwireError
from gradwire.schedules.ir import Schedule


@dataclass(frozen=True)
class CostParams:
    """α in seconds per message, β seconds per byte, γ seconds per byte combined; a link's
    token bucket of ``burst`` bytes and the credit each link holds when a schedule starts
    (see the module docstring; both 0: a plain link)."""

    alpha: float
    beta: float
    gamma: float = 0.0
    burst: float = 0.0
    start_credit: float = 0.0

    @staticmethod
    def for_link(bits_per_s: float, alpha: float = DEFAULT_ALPHA_S,
                 gamma: float = 0.0) -> CostParams:
        bits = check_real("a link's bandwidth (bits/s)", bits_per_s, above=True)
        beta = 8.0 / bits
        if not math.isfinite(beta):  # a subnormal rate: β = inf, and every cost NaN (inf·0)
            raise GradwireError(f"a link's bandwidth (bits/s) must be large enough that a byte "
                                f"takes a finite time (8/bandwidth seconds), got {bits_per_s!r}")
        return CostParams(check_real("α (s)", alpha), beta, check_real("γ (s/B)", gamma))


@dataclass(frozen=True)
class Traffic:
    """Per-rank totals: what the transport's counters must show after one run."""

    bytes_sent: np.ndarray  # [rank, peer]
    messages_sent: np.ndarray  # [rank, peer]
    bytes_reduced: np.ndarray  # [rank]

    @property
    def bytes_received(self) -> np.ndarray:
        return self.bytes_sent.T

    @property
    def messages_received(self) -> np.ndarray:
        return self.messages_sent.T


def traffic(s: Schedule, itemsize: int) -> Traffic:
    p = s.world_size
    sent = np.zeros((p, p), dtype=np.int64)
    msgs = np.zeros((p, p), dtype=np.int64)
    red = np.zeros(p, dtype=np.int64)
    for _, t in s.transfers():
        sent[t.src, t.dst] += t.count * itemsize
        msgs[t.src, t.dst] += 1
        if t.reduces:
            red[t.dst] += t.count * itemsize
    return Traffic(sent, msgs, red)


def step_times(s: Schedule, params: CostParams, itemsize: int) -> list[float]:
    """Time of each step under ``params``."""
    start = _start_credit(s.world_size, params)
    return _run(s, params, itemsize, start, start.copy())[0]


def _start_credit(p: int, params: CostParams) -> np.ndarray:
    """Every link's credit when the first schedule starts: ``start_credit``, within the bucket."""
    return np.full(p, min(max(params.start_credit, 0.0), max(params.burst, 0.0)))


def _run(s: Schedule, params: CostParams, itemsize: int, credit_out: np.ndarray,
         credit_in: np.ndarray) -> tuple[list[float], np.ndarray, np.ndarray]:
    """Each step's time, and every link's credit (out, in) after the last, from the credit
    each holds at the start."""
    p = s.world_size
    a, bt, g = params.alpha, params.beta, params.gamma
    cap = max(params.burst, 0.0)
    out = []
    for step in s.steps:
        m_out, b_out, m_in, b_in, b_red = (np.zeros(p) for _ in range(5))
        for t in step.transfers:
            b = t.count * itemsize
            m_out[t.src] += 1
            b_out[t.src] += b
            m_in[t.dst] += 1
            b_in[t.dst] += b
            if t.reduces:
                b_red[t.dst] += b
        wire_out = np.maximum(b_out - credit_out, 0.0)
        wire_in = np.maximum(b_in - credit_in, 0.0)
        per_rank = np.maximum(a * m_out + bt * wire_out, a * m_in + bt * wire_in) + g * b_red
        took = float(per_rank.max())
        out.append(took)
        if cap > 0:
            earned = took / bt if bt > 0 else cap
            credit_out = np.clip(credit_out + earned - b_out, 0.0, cap)
            credit_in = np.clip(credit_in + earned - b_in, 0.0, cap)
    return out, credit_out, credit_in


def cost(s: Schedule, params: CostParams, itemsize: int = 4) -> float:
    """Predicted seconds for ``s`` on buffers of ``itemsize``-byte elements."""
    return sum(step_times(s, params, itemsize))


BACK_TO_BACK_CALLS = 3  # the credit a call leaves is its tail's, so the third call is steady


def back_to_back(parts: list[tuple[Schedule, int]], params: CostParams) -> float:
    """Seconds of one call made of ``parts`` (schedules run one after another, each with its
    itemsize: a call header's exchange, then the data) when calls follow each other back to
    back, as ``gradwire bench`` times them and training makes them: every link carries its
    token-bucket credit from one schedule into the next and from one call into the next (a
    link whose last send came early, like a pipeline's root or a tree's leaves, earns while
    the call drains). The first call starts from ``params.start_credit``; the last of
    ``BACK_TO_BACK_CALLS`` is timed. Without a bucket it is the sum of the parts' costs."""
    if params.burst <= 0 or params.beta <= 0 or not parts:
        return sum(cost(s, params, itemsize) for s, itemsize in parts)
    start = _start_credit(parts[0][0].world_size, params)
    credit_out, credit_in = start, start.copy()
    total = 0.0
    for _ in range(BACK_TO_BACK_CALLS):
        total = 0.0
        for s, itemsize in parts:
            times, credit_out, credit_in = _run(s, params, itemsize, credit_out, credit_in)
            total += sum(times)
    return total
