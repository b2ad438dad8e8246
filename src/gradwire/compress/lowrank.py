"""PowerSGD (Vogels et al. 2019): each weight matrix of a bucket replaced by a rank-r product.

The layout is PyTorch's (:func:`layout`): a tensor of two or more dimensions is its own matrix,
shape[0] rows by the product of the rest; matrices of one shape are batched into one matmul;
1-D tensors, and matrices whose P and Q would be more than half their size, go as they are. A
bucket whose tensors' shapes are not known (a flat tensor) is one almost square rows×cols
matrix (:func:`matrix_shape`, zero-padded). One step, per bucket:

1. P = M·Q per matrix, with Q (cols×r) the previous step's Q (warm start) or random at the
   first, each column scaled so that |P| stays within max|M| (step 2 undoes the scale);
   allreduce every P with the uncompressed tensors, in one allreduce.
2. Orthogonalise each P (QR: a zero column comes out a unit vector, so M̂ below is still M's
   projection onto P's columns: no NaN, and error feedback keeps the rest).
3. Q = Mᵀ·P / 2^t, P = P·2^t, with 2^t ≥ √rows; allreduce every Q, in a second allreduce.
4. M̂ = P·Qᵀ, within the dtype's largest value (error feedback keeps what it clips, up
   to that value: :func:`gradwire.compress.feedback.unapplied`).

The power of two in step 3 keeps Q within max|M| (Mᵀ·P itself reaches max|M|·√rows, past
fp32's largest value for gradients near it) and changes no bit of M̂: scaling by a power of two
is exact, so every product in P·Qᵀ is the one it was unscaled.

Both allreduces sum, so P and Q are associative: each rank ends with the approximation of the
sum of the ranks' M. That needs a collective between steps 1 and 3, so :class:`PowerSGD`
exposes the steps (``p``, ``q``, ``decompress``), on one matrix or a batch of them.
:class:`PowerSGDCompressor` runs all of them locally behind the one-shot compressor interface
(each rank's own rank-r approximation of the flat input, gathered, not summed).

P and Q are fp32 (fp64 for fp64 buckets). Warning: a hook that issues the two allreduces per
bucket must issue them in the same order on every rank (PyTorch's own hook, which starts them
from future callbacks, aborted on gloo with several buckets in flight).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from gradwire.check import check_int, is_int
from gradwire.compress.base import Compressor, Payload, check_input, expect, generator
from gradwire.dtypes import acc_dtype
from gradwire.errors import GradwireError

# PyTorch's min_compression_rate: a matrix is compressed when rows·cols > 2·(rows + cols)·r
# (its _should_compress: strictly, so a matrix at exactly twice goes as it is).
MIN_COMPRESSION_RATE = 2


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
    """The first ``numel`` elements of ``m`` as a 1-D tensor of ``dtype``, within its range
    (:func:`_bounded`)."""
    return _bounded(m.reshape(-1)[:numel], dtype).to(dtype)


def _bounded(t: torch.Tensor, dtype: torch.dtype, inplace: bool = False) -> torch.Tensor:
    """``t`` (fp32 or fp64) clamped to ± the largest value of ``dtype``: a rank-r
    approximation can overshoot max|x|, and the cast to a 16-bit bucket's dtype would make inf
    of a finite gradient, or the product P·Qᵀ itself pass fp32's (as QSGD's top level, never
    past the largest value; error feedback keeps the rest). Where M̂ lies on the other side of
    zero from x near the largest value, x − M̂ passes it: the residual saturates there
    (:func:`gradwire.compress.feedback.unapplied`). NaN stays NaN. In place when
    ``inplace``."""
    top = torch.finfo(dtype).max
    return t.clamp_(-top, top) if inplace else t.clamp(-top, top)


@dataclass(frozen=True)
class Batch:
    """Matrices of one shape, compressed together: the ``spans`` (offset, elements) of the
    bucket that hold them, each read row-major as ``rows``×``cols`` (zero-padded where a span
    is shorter, as a flat bucket's one matrix), rank ``r``."""

    rows: int
    cols: int
    r: int
    spans: tuple[tuple[int, int], ...]

    @property
    def p_count(self) -> int:
        return len(self.spans) * self.rows * self.r

    @property
    def q_count(self) -> int:
        return len(self.spans) * self.cols * self.r

    def view(self, x: torch.Tensor) -> torch.Tensor | None:
        """The matrices of 1-D ``x`` as a (count, rows, cols) view of it, when they lie there
        back to back, unpadded; else None."""
        size = self.rows * self.cols
        (first, _), count = self.spans[0], len(self.spans)
        if all(n == size and at == first + i * size for i, (at, n) in enumerate(self.spans)):
            return x[first : first + count * size].view(count, self.rows, self.cols)
        return None

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.spans), self.rows, self.cols

    def gather(self, x: torch.Tensor, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """The matrices of 1-D ``x`` as one (count, rows, cols) tensor in ``dtype``: a view of
        ``x`` where they lie there back to back, else a copy (into ``out`` when given, a
        buffer of that shape and dtype kept from step to step)."""
        v = self.view(x)
        if v is not None:
            return v.to(dtype)
        if out is None:
            out = x.new_empty(self.shape, dtype=dtype)
        flat = out.view(len(self.spans), -1)
        for i, (at, n) in enumerate(self.spans):
            flat[i, :n] = x[at : at + n]
            flat[i, n:] = 0
        return out

    def scatter(self, m: torch.Tensor, out: torch.Tensor) -> None:
        """Write the (count, rows, cols) ``m`` back over the spans of 1-D ``out``."""
        flat = m.reshape(len(self.spans), -1)
        for i, (at, n) in enumerate(self.spans):
            out[at : at + n] = flat[i, :n]

    def product_into(self, p: torch.Tensor, q: torch.Tensor, out: torch.Tensor,
                     scratch: torch.Tensor | None = None) -> None:
        """Write P·Qᵀ over the spans of 1-D ``out``: in place where they lie back to back in
        P's dtype, else through ``scratch`` (a (count, rows, cols) buffer in P's dtype; a new
        one when None)."""
        v = self.view(out) if out.dtype == p.dtype else None
        if v is not None:
            _bounded(torch.matmul(p, q.mT, out=v), out.dtype, inplace=True)
        else:
            self.scatter(_bounded(torch.matmul(p, q.mT, out=scratch), out.dtype, inplace=True),
                         out)


@dataclass(frozen=True)
class Layout:
    """How PowerSGD sends a bucket of ``numel`` elements: the :class:`Batch` es of matrices it
    compresses and the ``plain`` spans (offset, elements) it sends as they are."""

    numel: int
    batches: tuple[Batch, ...]
    plain: tuple[tuple[int, int], ...]

    @property
    def plain_count(self) -> int:
        return sum(n for _, n in self.plain)

    @property
    def p_count(self) -> int:
        return sum(b.p_count for b in self.batches)

    @property
    def q_count(self) -> int:
        return sum(b.q_count for b in self.batches)

    def gather_plain(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([x[at : at + n].to(dtype) for at, n in self.plain]) if self.plain \
            else x.new_zeros(0, dtype=dtype)

    def scatter_plain(self, values: torch.Tensor, out: torch.Tensor) -> None:
        done = 0
        for at, n in self.plain:
            out[at : at + n] = values[done : done + n]
            done += n


def layout(numel: int, shapes: Sequence[Sequence[int]] | None, rank: int) -> Layout:
    """PowerSGD's :class:`Layout` of a bucket of ``numel`` elements holding tensors of
    ``shapes`` in order (their elements summing to ``numel``), at ``rank``; ``shapes`` None: one
    flat tensor, one :func:`matrix_shape` matrix. Made once per bucket shape: a hook asks for
    it at every bucket of every step (twice: for the plan, then to run it). Shapes that are
    not sequences of integers >= 0 are a one-line error."""
    if shapes is None:
        return _layout(numel, None, rank)
    try:
        key = tuple(map(tuple, shapes))
    except TypeError:  # shapes=5, or [5]: not a sequence of sequences
        raise GradwireError(f"powersgd: shapes must be a sequence of tensor shapes (sequences "
                            f"of integers >= 0), got {shapes!r}") from None
    return _layout(numel, key, rank)


@functools.lru_cache(maxsize=1024)
def _layout(numel: int, shapes: tuple[tuple[int, ...], ...] | None, rank: int) -> Layout:
    if shapes is None:
        rows, cols = matrix_shape(numel)
        tensors: list[tuple[int, int, int, int]] = [(0, numel, rows, cols)] if numel else []
    else:
        tensors, at = [], 0
        for shape in shapes:
            # a string dimension raised a TypeError, a negative or fractional one passed
            # where the product matched (rows of -2, or 2.5)
            if not all(is_int(d, 0) for d in shape):
                raise GradwireError(f"powersgd: a tensor shape holds integers >= 0, got "
                                    f"{shape!r}")
            n = math.prod(shape)
            if n:
                # a 1-D (or 0-d) tensor is its own row: never compressed
                tensors.append((at, n, shape[0], n // shape[0]) if len(shape) > 1
                               else (at, n, 1, n))
            at += n
        if at != numel:
            raise GradwireError(f"powersgd: the tensors' shapes hold {at} elements, the bucket "
                                f"{numel}")
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    plain = []
    for at, n, rows, cols in tensors:
        r = min(rank, rows, cols)
        if rows * cols > MIN_COMPRESSION_RATE * (rows + cols) * r:
            groups.setdefault((rows, cols), []).append((at, n))
        else:
            plain.append((at, n))
    batches = tuple(Batch(rows, cols, min(rank, rows, cols), tuple(spans))
                    for (rows, cols), spans in groups.items())
    return Layout(numel, batches, tuple(plain))


def _half_log2(n: int) -> int:
    """The smallest s with 2^s ≥ √n."""
    return ((n - 1).bit_length() + 1) // 2


SPARE_STEP = -1  # the generator step of the spare columns (every real step is >= 0)


class PowerSGD:
    """The steps of PowerSGD, with the warm-start memory of Q per bucket ``key``.

    Tuned by the user: ``rank`` (r), ``warm_start``, ``seed`` (must be equal on all ranks: the
    first Q is drawn from it). Internal: the Q memory per key (a key of None means "by matrix
    shape"), a step counter, and per shape a spare random Q for zero columns. Ranks must make
    the same calls in the same order.

    ``m`` is one rows×cols matrix or a (count, rows, cols) batch of them; P and Q follow.

    Example, one bucket ``x`` on each rank::

        ps = PowerSGD(rank=4)
        m = to_matrix(x)
        p = ps.p(m, key=i);     dist.all_reduce(p)
        q = ps.q(m, p, key=i);  dist.all_reduce(q)    # p is now orthogonal (in place)
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
        self._spares: dict[tuple, torch.Tensor] = {}

    def effective_rank(self, rows: int, cols: int) -> int:
        return min(self.rank, rows, cols)

    @staticmethod
    def _key(m: torch.Tensor, key: Hashable | None) -> Hashable:
        return tuple(m.shape) if key is None else key

    def _random(self, shape: tuple[int, ...], like: torch.Tensor, step: int) -> torch.Tensor:
        g = generator(self.seed, step)  # on the CPU: identical on every rank and device
        return torch.randn(shape, generator=g, dtype=like.dtype).to(like.device)

    def _spare(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A random matrix of ``shape`` drawn once (the same on every rank) and kept on
        ``like``'s device: what replaces a warm start's zero columns, with no draw on the
        host and no copy to the device per step."""
        key = (shape, like.dtype, like.device)
        spare = self._spares.get(key)
        if spare is None:
            spare = self._spares[key] = self._random(shape, like, SPARE_STEP)
        return spare

    def p(self, m: torch.Tensor, key: Hashable | None = None) -> torch.Tensor:
        """Step 1: P = M·Q (rows×r), Q from memory (warm start) or random. Allreduce it."""
        *count, rows, cols = m.shape
        shape = (*count, cols, self.effective_rank(rows, cols))
        step, self.step = self.step, self.step + 1
        q = self.memory.get(self._key(m, key)) if self.warm_start else None
        if q is None or q.shape != shape:
            q = self._random(shape, m, step)
            self._spare(shape, m)  # drawn now too: no later step draws on the host
        elif q.numel():
            # A zero column (after an all-zero gradient) would stay zero forever, a non-finite
            # one make every P NaN: redraw it.
            q = q.to(m)
            top = q.abs().amax(dim=-2, keepdim=True)
            q = torch.where((top > 0) & top.isfinite(), q, self._spare(shape, m))
        if not q.numel():
            return m @ q
        # Each column of Q scaled to a 1-norm of at most 1/(2√rows), so that a column of P
        # has a norm of at most max|M|/2 (QR's Householder sums, up to twice a column's norm,
        # stay within max|M|) whatever Q's own scale: a warm start (Mᵀ·P) is of M's scale, and
        # P would be of its square (overflow from |M| ≈ 1e19, underflow below 1e-19).
        # Orthogonalising P undoes any positive column scale.
        top = q.abs().amax(dim=-2, keepdim=True)
        shift = (cols - 1).bit_length() + _half_log2(rows) + 1
        return m @ (q / top / 2.0**shift)

    def q(self, m: torch.Tensor, p: torch.Tensor, key: Hashable | None = None) -> torch.Tensor:
        """Steps 2–3: orthogonalise ``p`` (the reduced P) in place, its columns then of norm
        2^t (the smallest with 2^t ≥ √rows), and return Q = Mᵀ·P / 2^(2t) (cols×r): P·Qᵀ is
        M's projection onto P's columns, and Q stays within max|M|. Allreduce it. Q is also
        kept as the next warm start (until ``decompress`` replaces it with the reduced Q)."""
        shift = _half_log2(m.shape[-2])
        if p.shape[-1] > 0:
            p.copy_(torch.linalg.qr(p).Q).div_(2.0**shift)  # exact: a power of two
        # (Pᵀ·M)ᵀ, not Mᵀ·P: the same product, but reading M row by row; on this CPU Mᵀ·P took
        # 100 ms for a 5060×5060 M at r = 4 against 20 ms (benchmarks/compress_speed.py).
        q = (p.mT @ m).mT.contiguous()
        p.mul_(2.0 ** (2 * shift))
        self.memory[self._key(m, key)] = q
        return q

    def decompress(self, p: torch.Tensor, q: torch.Tensor,
                   key: Hashable | None = None) -> torch.Tensor:
        """Step 4: M̂ = P·Qᵀ (rows×cols). Keeps ``q`` (pass the reduced one, so every rank keeps
        the same memory) as the next warm start."""
        self.keep(q, (*p.shape[:-1], q.shape[-2]) if key is None else key)
        return p @ q.mT

    def keep(self, q: torch.Tensor, key: Hashable) -> None:
        """Keep ``q``, the reduced Q of ``key``, as its next warm start (what
        :meth:`decompress` does, for a caller that forms P·Qᵀ itself)."""
        self.memory[key] = q

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step, "memory": dict(self.memory)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Both fields read before either is set: a state that lacks one leaves this one as
        it was, not half loaded."""
        step, memory = int(state["step"]), dict(state["memory"])  # type: ignore[arg-type, call-overload]
        self.step, self.memory = step, memory


@dataclass(frozen=True, kw_only=True)
class LowRankPayload(Payload):
    p: torch.Tensor  # rows×r, orthogonal columns of norm 2^t (PowerSGD.q)
    q: torch.Tensor  # cols×r


class PowerSGDCompressor(Compressor):
    """PowerSGD's steps run locally: each rank's own rank-r approximation P·Qᵀ.

    Not associative (P·Qᵀ summed over ranks is not (ΣP)(ΣQ)ᵀ): gather the payloads and
    decompress each, or use :class:`PowerSGD`'s steps with two allreduces instead. Wire: P and Q,
    (rows + cols)·r fp32 words, r = min(rank, rows, cols).
    """

    name = "powersgd"
    error_feedback = True
    residual_may_overflow = True

    def __init__(self, rank: int = 4, warm_start: bool = True, seed: int = 0) -> None:
        super().__init__(seed)
        self.power = PowerSGD(rank, warm_start, seed)
        self.buffers: dict[Hashable, torch.Tensor] = {}  # scratch (:meth:`scratch`), not state

    @property
    def params(self) -> dict[str, object]:
        return {"rank": self.power.rank}

    def compress(self, x: torch.Tensor) -> LowRankPayload:
        x = check_input(self.name, x)
        m = to_matrix(x)
        p = self.power.p(m)
        q = self.power.q(m, p)
        return LowRankPayload(dtype=x.dtype, p=p, q=q)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        pl = expect(self.name, payload, LowRankPayload)
        return from_matrix(pl.p @ pl.q.T, numel, pl.dtype)

    def scratch(self, key: Hashable, batch: Batch, like: torch.Tensor) -> torch.Tensor | None:
        """A buffer for ``batch``'s matrices when they do not lie back to back in a bucket of
        ``like`` (None when they do), kept under ``key`` from step to step: a fresh one each
        step would cost its page faults on the host every time."""
        if batch.view(like) is not None:
            return None
        dtype = acc_dtype(like.dtype)
        buf = self.buffers.get(key)
        if buf is None or buf.shape != batch.shape or buf.dtype != dtype or \
                buf.device != like.device:
            buf = self.buffers[key] = like.new_empty(batch.shape, dtype=dtype)
        return buf

    def forget(self, used: set) -> None:
        """Drop what the hooks kept (keyed (bucket, rows, cols)) for buckets not in ``used``;
        what :meth:`compress` called directly keeps (keyed (rows, cols)) stays."""
        for kept in (self.power.memory, self.buffers):
            for key in [k for k in kept if len(k) == 3 and k[0] not in used]:  # type: ignore
                del kept[key]

    def layout(self, numel: int, shapes: Sequence[Sequence[int]] | None = None) -> Layout:
        """How the two-allreduce form sends a bucket of tensors of ``shapes`` (:func:`layout`)."""
        return layout(numel, shapes, self.power.rank)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        rows, cols = matrix_shape(numel)
        r = self.power.effective_rank(rows, cols)
        return (rows + cols) * r * acc_dtype(dtype).itemsize

    def state_dict(self) -> dict[str, object]:
        return self.power.state_dict()

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.power.load_state_dict(state)
