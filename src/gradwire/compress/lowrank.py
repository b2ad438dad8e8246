"""PowerSGD (Vogels et al. 2019): a rank-r approximation of the bucket seen as a matrix.

The bucket's n elements are laid out row-major in an almost square rows×cols matrix M
(:func:`matrix_shape`, zero-padded). One step, per bucket:

1. P = M·Q, with Q (cols×r) the previous step's Q (warm start) or random at the first step;
   allreduce P.
2. Orthogonalise P (QR; columns that are zero stay harmless: no NaN, zero contribution).
3. Q = Mᵀ·P; allreduce Q.
4. M̂ = P·Qᵀ.

Both allreduces sum, so P and Q are associative: 2 allreduces of (rows + cols)·r words instead
of one of n, about 2√n·r; each rank ends with the approximation of the sum of the ranks' M.
That needs a collective between steps 1 and 3, so :class:`PowerSGD` exposes the steps
(``p``, ``q``, ``decompress``). :class:`PowerSGDCompressor` runs all of them locally behind the
one-shot compressor interface (each rank's own rank-r approximation, gathered, not summed).

P and Q are fp32 (fp64 for fp64 buckets). Warning: a hook that issues the two allreduces per
bucket must issue them in the same order on every rank (PyTorch's own hook, which starts them
from future callbacks, aborted on gloo with several buckets in flight).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from gradwire.check import check_int
from gradwire.compress.base import Compressor, Payload, check_input, expect, generator
from gradwire.dtypes import acc_dtype
from gradwire.errors import GradwireError


def matrix_shape(numel: int) -> tuple[int, int]:
    """(rows, cols) with cols = ⌈√n⌉, rows = ⌈n/cols⌉: rows ≤ cols, rows·cols − n < cols."""
    if numel == 0:
        return 0, 0
    cols = math.isqrt(numel - 1) + 1
    return -(-numel // cols), cols


def to_matrix(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The 1-D ``x`` as a :func:`matrix_shape` matrix, zero-padded, in ``dtype`` (default fp32,
    fp64 for fp64 input)."""
    rows, cols = matrix_shape(x.numel())
    pad = rows * cols - x.numel()
    m = x.to(dtype or acc_dtype(x.dtype))
    if pad:
        m = torch.cat([m, m.new_zeros(pad)])
    return m.reshape(rows, cols)


def from_matrix(m: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``numel`` elements of ``m`` as a 1-D tensor of ``dtype``."""
    return m.reshape(-1)[:numel].to(dtype)


class PowerSGD:
    """The steps of PowerSGD, with the warm-start memory of Q per bucket ``key``.

    Tuned by the user: ``rank`` (r), ``warm_start``, ``seed`` (must be equal on all ranks: the
    first Q is drawn from it). Internal: the Q memory per key (a key of None means "by matrix
    shape") and a step counter. Ranks must make the same calls in the same order.

    Example, one bucket ``x`` on each rank::

        ps = PowerSGD(rank=4)
        m = to_matrix(x)
        p = ps.p(m, key=i);     dist.all_reduce(p)
        q = ps.q(m, p, key=i);  dist.all_reduce(q)    # p is now orthonormal (in place)
        x_hat = from_matrix(ps.decompress(p, q, key=i), x.numel(), x.dtype) / world_size
    """

    def __init__(self, rank: int = 1, warm_start: bool = True, seed: int = 0) -> None:
        self.rank = check_int("powersgd", "rank", rank, 1)
        if not isinstance(warm_start, bool):
            raise GradwireError(f"powersgd: warm_start must be True or False, got "
                                f"{warm_start!r}")
        self.warm_start = warm_start
        self.seed = check_int("powersgd", "seed", seed, 0)
        self.step = 0
        self.memory: dict[Hashable, torch.Tensor] = {}

    def effective_rank(self, rows: int, cols: int) -> int:
        return min(self.rank, rows, cols)

    @staticmethod
    def _key(m: torch.Tensor, key: Hashable | None) -> Hashable:
        return tuple(m.shape) if key is None else key

    def _random(self, cols: int, r: int, like: torch.Tensor) -> torch.Tensor:
        g = generator(self.seed, self.step)  # on the CPU: identical on every rank and device
        return torch.randn(cols, r, generator=g, dtype=like.dtype).to(like.device)

    def p(self, m: torch.Tensor, key: Hashable | None = None) -> torch.Tensor:
        """Step 1: P = M·Q (rows×r), Q from memory (warm start) or random. Allreduce it."""
        rows, cols = m.shape
        r = self.effective_rank(rows, cols)
        fresh = self._random(cols, r, m)
        self.step += 1
        q = self.memory.get(self._key(m, key)) if self.warm_start else None
        if q is None or q.shape != (cols, r):
            q = fresh
        else:
            # A zero column (after an all-zero gradient) would stay zero forever: redraw it.
            q = torch.where(q.norm(dim=0) > 0, q.to(m), fresh)
        return m @ q

    def q(self, m: torch.Tensor, p: torch.Tensor, key: Hashable | None = None) -> torch.Tensor:
        """Steps 2–3: orthogonalise ``p`` (the reduced P) in place, return Q = Mᵀ·P (cols×r).
        Allreduce it. Q is also kept as the next warm start (until ``decompress`` replaces it
        with the reduced Q)."""
        if p.shape[1] > 0:
            p.copy_(torch.linalg.qr(p).Q)
        # (Pᵀ·M)ᵀ, not Mᵀ·P: the same product, but reading M row by row; on this CPU Mᵀ·P took
        # 100 ms for a 5060×5060 M at r = 4 against 20 ms (benchmarks/compress_speed.py).
        q = (p.T @ m).T.contiguous()
        self.memory[self._key(m, key)] = q
        return q

    def decompress(self, p: torch.Tensor, q: torch.Tensor,
                   key: Hashable | None = None) -> torch.Tensor:
        """Step 4: M̂ = P·Qᵀ (rows×cols). Keeps ``q`` (pass the reduced one, so every rank keeps
        the same memory) as the next warm start."""
        self.memory[(p.shape[0], q.shape[0]) if key is None else key] = q
        return p @ q.T

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step, "memory": dict(self.memory)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.step = int(state["step"])  # type: ignore[arg-type]
        self.memory = dict(state["memory"])  # type: ignore[call-overload]


@dataclass(frozen=True, kw_only=True)
class LowRankPayload(Payload):
    p: torch.Tensor  # rows×r, orthonormal columns
    q: torch.Tensor  # cols×r


class PowerSGDCompressor(Compressor):
    """PowerSGD's steps run locally: each rank's own rank-r approximation P·Qᵀ.

    Not associative (P·Qᵀ summed over ranks is not (ΣP)(ΣQ)ᵀ): gather the payloads and
    decompress each, or use :class:`PowerSGD`'s steps with two allreduces instead. Wire: P and Q,
    (rows + cols)·r fp32 words, r = min(rank, rows, cols).
    """

    name = "powersgd"
    error_feedback = True

    def __init__(self, rank: int = 4, warm_start: bool = True, seed: int = 0) -> None:
        super().__init__(seed)
        self.power = PowerSGD(rank, warm_start, seed)

    @property
    def params(self) -> dict[str, object]:
        return {"rank": self.power.rank}

    def compress(self, x: torch.Tensor) -> LowRankPayload:
        check_input(self.name, x)
        m = to_matrix(x)
        p = self.power.p(m)
        q = self.power.q(m, p)
        return LowRankPayload(dtype=x.dtype, p=p, q=q)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        pl = expect(self.name, payload, LowRankPayload)
        return from_matrix(pl.p @ pl.q.T, numel, pl.dtype)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        rows, cols = matrix_shape(numel)
        r = self.power.effective_rank(rows, cols)
        return (rows + cols) * r * acc_dtype(dtype).itemsize

    def state_dict(self) -> dict[str, object]:
        return self.power.state_dict()

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.power.load_state_dict(state)
