"""Quantizers: fewer bits per element, every element sent.

- ``signsgd``: 1 bit, the sign (Bernstein et al. 2018); ranks combine by majority vote,
  :func:`majority_vote`, which is not a sum, so the payloads are gathered.
- ``efsignsgd``: the sign scaled by ||x||₁/n (Karimireddy et al. 2019), meant to run under
  :class:`gradwire.compress.ErrorFeedback`.
- ``qsgd``: s levels of |x|/||x||₂ with stochastic rounding (Alistarh et al. 2017), unbiased.
- ``terngrad``: {−1, 0, 1}·max|x| with stochastic rounding (Wen et al. 2017), unbiased.
- ``int8``: x rounded to the nearest of 255 levels, 8 bits each, one scale per block of 1024
  elements. Biased; meant for error feedback. Alone it scales each block by its own max|x|.
  In an aggregation (:mod:`gradwire.catalogue`) the ranks share each block's step size, a
  power of √2 agreed by votes that travel with the previous step's data, and each rank
  sends at most ⌊127/P⌋ levels, so that the int8 values of all P ranks sum without overflow
  in one int8 allreduce.

Wire for n elements: signsgd ⌈n/8⌉ bytes; efsignsgd ⌈n/8⌉ + one scale; qsgd one norm + ⌈n/8⌉
sign bytes + ⌈n·w/8⌉ level bytes, w the narrowest of 1, 2, 4, 8 bits holding 0..s (2 or 4 bytes
per level when s ≥ 256); terngrad ⌈n/4⌉ + one scale; int8 n + one scale per 1024 elements.
Norms and scales are fp32 (fp64 for fp64 input). The stochastic ones draw from (seed, step):
give each rank its own seed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gradwire.check import check_int, is_int
from gradwire.compress import blocks
from gradwire.compress.base import Compressor, Payload, check_input, expect
from gradwire.compress.bits import code_width, decode_codes, pack_bits, packed_bytes
from gradwire.dtypes import acc_dtype
from gradwire.errors import GradwireError

# Levels are formed in fp32 for fp32/fp16/bf16 input, which holds every integer only up to
# 2**24: a larger s would round its top levels (2**31 - 1 rounds up to 2**31, past int32).
QSGD_MAX_S = 2**24


@dataclass(frozen=True, kw_only=True)
class SignPayload(Payload):
    bits: torch.Tensor  # 1 = x ≥ 0, packed 8 to a byte


@dataclass(frozen=True, kw_only=True)
class ScaledSignPayload(SignPayload):
    scale: torch.Tensor  # one element


def _signs(x: torch.Tensor) -> torch.Tensor:
    return pack_bits((x >= 0).to(torch.uint8), 1)


def _power_of_two_at_most(t: torch.Tensor) -> torch.Tensor:
    """2^e with 2^e ≤ t < 2^(e+1) (``t`` a 0-d tensor, > 0 and finite), else 1: values of
    magnitude up to t divided by it are below 2, exactly (a power of two), so their squares and
    sums cannot overflow, and scaling the result back gives the same bits where the direct
    sum did not overflow."""
    one = torch.ones_like(t)
    return torch.where((t > 0) & t.isfinite(), torch.ldexp(one, torch.frexp(t).exponent - 1),
                       one)


def _largest(a: torch.Tensor) -> torch.Tensor:
    """max(a) of 1-D ``a`` (0-d; 0 when ``a`` is empty)."""
    return a.amax() if a.numel() else a.new_zeros(())


def _signed(bits: torch.Tensor, numel: int, scale: torch.Tensor | float,
            dtype: torch.dtype) -> torch.Tensor:
    """±scale in ``dtype`` from packed bits (1: +, as :func:`_signs` packs x ≥ 0). The two
    values are formed in ``scale``'s precision and rounded to ``dtype`` once, in the table:
    the elements are those of rounding every element afterwards, and only ``dtype``'s
    bytes are written."""
    like = scale.dtype if isinstance(scale, torch.Tensor) else dtype
    values = (torch.tensor([-1.0, 1.0], dtype=like, device=bits.device) * scale).to(dtype)
    return decode_codes(bits, 1, numel, values)


class SignSGD(Compressor):
    """sign(x) in 1 bit per element (0 counts as +); decompress gives ±1 in x's dtype."""

    name = "signsgd"

    def __init__(self) -> None:
        super().__init__()

    def compress(self, x: torch.Tensor) -> SignPayload:
        x = check_input(self.name, x)
        return SignPayload(dtype=x.dtype, bits=_signs(x))

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, SignPayload)
        return _signed(p.bits, numel, 1.0, p.dtype)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return packed_bytes(numel, 1)

    def combine(self, payloads: list[Payload], numel: int) -> torch.Tensor:
        """The majority vote of the ranks' signs (signSGD with majority vote)."""
        return majority_vote(payloads, numel)


def majority_vote(signs: Sequence[Payload] | torch.Tensor, numel: int | None = None
                  ) -> torch.Tensor:
    """The element-wise majority of the ranks' signs: +1, −1, or 0 where the vote is tied.

    ``signs`` is either a list of sign payloads (of ``signsgd`` or ``efsignsgd``; give
    ``numel``), in which case the result has the payloads' dtype, or a stacked (ranks, n) tensor
    of ±1, in which case it has that tensor's dtype.
    """
    if isinstance(signs, torch.Tensor):
        if signs.dim() != 2:
            raise GradwireError(f"majority_vote: expected stacked signs of shape (ranks, n), "
                                f"got shape {tuple(signs.shape)}")
        return torch.sign(signs.to(torch.int32).sum(0)).to(signs.dtype)
    if not signs or numel is None:
        raise GradwireError("majority_vote: give at least one sign payload and numel")
    payloads = [expect("majority_vote", p, SignPayload) for p in signs]
    if not is_int(numel, 0):
        raise GradwireError(f"majority_vote: numel must be an integer >= 0, got {numel!r}")
    want = packed_bytes(numel, 1)
    for p in payloads:  # as decompress refuses a numel the payload was not made from
        if p.bits.numel() != want:
            raise GradwireError(f"majority_vote: expected payloads of {numel} signs ({want} "
                                f"bytes), got one of {p.bits.numel()} bytes")
    # Count the ranks whose bit is 1 at every element, one bit position of every byte at a
    # time over all ranks' bytes at once: contiguous shifts and sums, in bytes while P < 256.
    # 4.4–9.8× faster than unpacking each rank to ±1 and adding them up (P = 2…16, 25.6 M
    # elements: benchmarks/compress_speed.py, part c). Σ(±1) = 2·ones − P.
    ranks = len(payloads)
    bits = torch.stack([p.bits for p in payloads])  # (P, ⌈n/8⌉)
    ones = torch.empty(bits.shape[1], 8, dtype=torch.uint8 if ranks < 256 else torch.int32,
                       device=bits.device)
    for j in range(8):  # element i is bit i % 8 of byte i // 8 (pack_bits)
        ones[:, j] = (bits >> j).bitwise_and_(1).sum(0, dtype=ones.dtype)
    vote = ones.view(-1)[:numel].to(torch.float32).mul_(2).sub_(ranks).sign_()
    return vote.to(payloads[0].dtype)


class EFSignSGD(Compressor):
    """(||x||₁/n)·sign(x): 1 bit per element and one scale. Biased; pair it with
    :class:`ErrorFeedback` (EF-SignSGD, Karimireddy et al. 2019)."""

    name = "efsignsgd"
    error_feedback = True

    def __init__(self) -> None:
        super().__init__()

    def compress(self, x: torch.Tensor) -> ScaledSignPayload:
        x = check_input(self.name, x)
        acc = acc_dtype(x.dtype)
        # summed in fp64: a sum of finite values can overflow fp32 (3e38 + 3e38) where their
        # mean, at most the largest, cannot; an fp64 sum can overflow fp64 itself (1e308 +
        # 1e308), so fp64 input is summed in units of a power of two at most max|x|
        a, n = x.abs(), max(x.numel(), 1)
        if x.dtype == torch.float64:
            unit = _power_of_two_at_most(_largest(a))
            scale = ((a / unit).sum().reshape(1) / n * unit).to(acc)
        else:
            scale = (a.sum(dtype=torch.float64).reshape(1) / n).to(acc)
        return ScaledSignPayload(dtype=x.dtype, bits=_signs(x), scale=scale)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, ScaledSignPayload)
        return _signed(p.bits, numel, p.scale, p.dtype)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return packed_bytes(numel, 1) + acc_dtype(dtype).itemsize


@dataclass(frozen=True, kw_only=True)
class QSGDPayload(Payload):
    norm: torch.Tensor  # one element
    signs: torch.Tensor  # 1 = negative, packed
    levels: torch.Tensor  # 0..s, packed when s < 256


class QSGD(Compressor):
    """x ≈ ||x||₂ · sign(x) · ℓ/s, ℓ ∈ {0..s} rounded stochastically so E[decompress] = x.

    ``s`` levels (s ≥ 1); levels are packed at 1, 2, 4 or 8 bits while s < 256 (s = 1: 1 bit,
    s ≤ 3: 2 bits, s ≤ 15: 4 bits, s ≤ 255: 8 bits).
    """

    name = "qsgd"
    per_rank_seed = True

    def __init__(self, s: int = 255, seed: int = 0) -> None:
        super().__init__(seed)
        self.s = check_int(self.name, "s", s, 1)
        if self.s > QSGD_MAX_S:
            raise GradwireError(f"qsgd: s must be at most {QSGD_MAX_S} (levels exact in fp32), "
                                f"got {s}")

    @property
    def params(self) -> dict[str, object]:
        return {"s": self.s}

    def _level_width(self) -> int | torch.dtype:
        if self.s < 256:
            return code_width(self.s + 1)
        return torch.int16 if self.s < 2**15 else torch.int32

    def compress(self, x: torch.Tensor) -> QSGDPayload:
        x = check_input(self.name, x)
        acc = acc_dtype(x.dtype)
        a = x.to(acc).abs()
        if x.dtype == torch.float64:
            # fp64 squares overflow fp64 itself from |x| ≈ 1.3e154 (then every element was
            # 0·inf): summed in units of a power of two at most max|x|
            largest = _largest(a)
            unit = _power_of_two_at_most(largest)
            norm = (torch.linalg.vector_norm(a / unit) * unit).reshape(1)
            nonfinite = ~largest.isfinite()
        else:
            # squares summed in fp64: in fp32 they overflow from a norm of about 1.8e19 on
            norm = torch.linalg.vector_norm(a, dtype=torch.float64).reshape(1)
            nonfinite = norm.isinf()  # only Inf in x makes an fp64 sum of these inf
        # A finite norm beyond x's dtype (an fp16 bucket's above 65504) would decompress its
        # top levels to inf, or overflow the fp32 norm itself (then every element is 0·inf):
        # any norm' ≥ max|x| keeps the rounding unbiased, and x's largest finite value is one.
        # Inf or NaN in x goes through as it is.
        norm = torch.where(nonfinite, norm, norm.clamp(max=torch.finfo(x.dtype).max))
        # Below s times acc's smallest normal, unit = norm/s is subnormal: rounded to a few
        # bits it could fall to 0 (every element sent as 0: 7e-45 in fp32 at s = 255) or
        # below norm/s (the top elements' levels then passed s and were clipped: 4.5e-43 came
        # back as 3.6e-43). Raised by 4·s subnormal steps, more than the roundings of norm and
        # unit can take away, the unit decompress forms is above the true norm/s, so no level
        # is clipped, and norm' ≥ max|x| still. A larger norm is left as it was.
        tiny = torch.finfo(acc).tiny
        sub = tiny * torch.finfo(acc).eps  # the smallest subnormal
        norm = torch.where((norm > 0) & (norm < self.s * tiny), norm + 4 * self.s * sub,
                           norm).to(acc)
        # r = |x| / unit with unit = norm/s, the very value decompress multiplies level ℓ by,
        # so E[ℓ]·unit = |x| whatever unit's own rounding. Not |x|·(s/norm): below a norm of
        # s·2^-128 (7.5e-37 at s = 255 in fp32) s/norm overflowed to inf and every nonzero
        # element came back as ±norm. A zero unit (a zero bucket) divides by 1: r stays 0.
        unit = norm / self.s
        r = a.div_(torch.where(unit > 0, unit, torch.ones_like(unit)))
        # floor(r + u), u ~ U[0, 1), rounds r up with probability r − ⌊r⌋: unbiased in one op.
        u = torch.rand(x.numel(), generator=self._generator(x.device), dtype=acc,
                       device=x.device)
        lev = r.add_(u).floor_().clamp_max_(self.s)
        w = self._level_width()
        levels = pack_bits(lev.to(torch.uint8), w) if isinstance(w, int) else lev.to(w)
        signs = pack_bits((x < 0).to(torch.uint8), 1)
        return QSGDPayload(dtype=x.dtype, norm=norm, signs=signs, levels=levels)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, QSGDPayload)
        w = self._level_width()
        # level ℓ is worth ℓ·(norm/s) in the norm's precision, rounded to x's dtype; the
        # sign (bit 1 = negative) then multiplies exactly
        unit = p.norm / self.s
        # s·(norm/s) may round above the norm: never past the dtype's largest value
        top = torch.finfo(p.dtype).max
        if isinstance(w, int):  # look the products up, one table entry per level
            levels = torch.arange(1 << w, dtype=p.norm.dtype, device=p.norm.device) * unit
            mag = decode_codes(p.levels, w, numel, levels.clamp_(max=top).to(p.dtype))
        else:
            mag = p.levels.to(p.norm.dtype) * unit
            if p.dtype == p.norm.dtype:  # a 16-bit cast rounds 1e-7 past its largest to it
                mag.clamp_(max=top)
            mag = mag.to(p.dtype)
        sign = torch.tensor([1.0, -1.0], dtype=p.dtype, device=mag.device)
        return mag.mul_(decode_codes(p.signs, 1, numel, sign))

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        w = self._level_width()
        levels = packed_bytes(numel, w) if isinstance(w, int) else numel * w.itemsize
        return acc_dtype(dtype).itemsize + packed_bytes(numel, 1) + levels


@dataclass(frozen=True, kw_only=True)
class TernaryPayload(Payload):
    codes: torch.Tensor  # 0: 0, 1: +scale, 2: −scale; 2 bits each, packed
    scale: torch.Tensor  # one element: max|x|


class TernGrad(Compressor):
    """x ≈ max|x| · sign(x) · b, b ~ Bernoulli(|x|/max|x|), so E[decompress] = x.
    (TernGrad's gradient clipping is left to the caller.)"""

    name = "terngrad"
    per_rank_seed = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)

    def compress(self, x: torch.Tensor) -> TernaryPayload:
        x = check_input(self.name, x)
        acc = acc_dtype(x.dtype)
        a = x.to(acc).abs()
        scale = a.max().reshape(1) if x.numel() else torch.zeros(1, dtype=acc, device=x.device)
        u = torch.rand(x.numel(), generator=self._generator(x.device), dtype=acc,
                       device=x.device)
        keep = u.mul_(scale) < a  # u·max < |x|  ⇔  u < |x|/max, and never when max = 0
        codes = keep.to(torch.uint8) << (x < 0).to(torch.uint8)
        return TernaryPayload(dtype=x.dtype, codes=pack_bits(codes, 2), scale=scale)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, TernaryPayload)
        # code 0: 0, 1: +scale, 2: −scale (3 is never sent)
        unit = torch.tensor([0.0, 1.0, -1.0, 0.0], dtype=p.scale.dtype, device=p.scale.device)
        return decode_codes(p.codes, 2, numel, (unit * p.scale).to(p.dtype))

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return packed_bytes(numel, 2) + acc_dtype(dtype).itemsize


INT8_MAX = 127
INT8_BLOCK = 1024  # elements per step size: one vote of 8 bytes per 1024 levels (0.8 %)
# An aggregation's step sizes are 2^(E/2), E an integer ("half octaves") per block. The moves
# of E one step may make, one vote slot each: a rank votes for the smallest that its block
# needs; every block takes the largest any rank voted for. Up to 16x a step, down to 1/2.8x.
INT8_MOVES = (-3, -2, -1, 0, 1, 2, 4, 8)
# The votes leave a block room to double (2 half octaves) before the next step clips it:
# clipping delays a block's largest values, which are the ones that matter most.
INT8_HEADROOM = 2
INT8_EXPONENT_LIMIT = 252  # |E| at most 252: every step size and its inverse is a normal fp32
# fp64 buckets take their steps in fp64: |E| up to 2044, every step and inverse a normal fp64
# (fp32's limit would send nothing of gradients below 2^-127 and at most 127·2^126.5 a step)
INT8_EXPONENT_LIMIT_FP64 = 2044
_SQRT2 = 1.4142135623730951


@dataclass(frozen=True, kw_only=True)
class Int8Payload(Payload):
    values: torch.Tensor  # int8 levels in [−127, 127]
    scale: torch.Tensor  # one per block of INT8_BLOCK elements: what one level stands for


def int8_budget(world: int) -> int:
    """B, the largest level each of ``world`` ranks may send, ⌊127/P⌋, so that the sum of
    their int8 values cannot overflow int8 whatever each sends. A one-line error above 127
    ranks, where no level is left."""
    budget = INT8_MAX // max(world, 1)
    if budget < 1:
        raise GradwireError(f"int8: {world} ranks leave no level to send (the sum of their "
                            f"int8 values must fit in int8): at most 127 ranks; use bf16")
    return budget


def int8_exponent_limit(dtype: torch.dtype) -> int:
    """The largest |E| of a bucket of ``dtype``, whose steps are in its accumulation dtype."""
    return INT8_EXPONENT_LIMIT_FP64 if acc_dtype(dtype) == torch.float64 else INT8_EXPONENT_LIMIT


def int8_exponent(bound: torch.Tensor, budget: int, limit: int = INT8_EXPONENT_LIMIT
                  ) -> torch.Tensor:
    """Per block (int64), the smallest E with budget·2^(E/2) ≥ ``bound``: the step size at
    which nothing of magnitude up to the bound is clipped; within ±``limit``
    (:func:`int8_exponent_limit`; a bound of 0 gives the smallest step, NaN too). No host
    read."""
    b = torch.nan_to_num(bound.to(torch.float64), nan=0.0)
    e = torch.ceil(torch.log2(b / budget).mul_(2))
    return e.clamp_(-limit, limit).to(torch.int64)


def int8_steps(exponent: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(2^(E/2), 2^(−E/2)) per block, in ``dtype``: a power of two, times √2 for odd E, so
    that every rank computes the same bits."""
    half = exponent >> 1  # ⌊E/2⌋
    odd = (exponent & 1).bool()
    one = torch.ones((), dtype=dtype, device=exponent.device)
    step = torch.ldexp(torch.where(odd, one * _SQRT2, one), half)
    inv = torch.ldexp(torch.where(odd, one / _SQRT2, one), -half)
    return step.to(dtype), inv.to(dtype)


@functools.cache
def _moves(device: torch.device) -> torch.Tensor:
    """INT8_MOVES on ``device``, made once (not copied to the device at every bucket)."""
    return torch.tensor(INT8_MOVES, dtype=torch.int64, device=device)


def int8_vote(bound: torch.Tensor, exponent: torch.Tensor, budget: int,
              limit: int = INT8_EXPONENT_LIMIT) -> torch.Tensor:
    """This rank's votes (blocks × len(INT8_MOVES), int8, a single 1 per row): per block the
    smallest move of ``exponent`` after which nothing up to twice ``bound`` would be clipped
    (INT8_HEADROOM; the largest move if none suffices); ``limit`` as :func:`int8_exponent`."""
    moves = _moves(exponent.device)
    need = (int8_exponent(bound, budget, limit) + INT8_HEADROOM - exponent).contiguous()
    slot = torch.searchsorted(moves, need).clamp_(max=len(INT8_MOVES) - 1)
    votes = torch.zeros(exponent.numel(), len(INT8_MOVES), dtype=torch.int8,
                        device=exponent.device)
    return votes.scatter_(1, slot[:, None], 1)


def int8_adopt(exponent: torch.Tensor, counts: torch.Tensor,
               limit: int = INT8_EXPONENT_LIMIT) -> torch.Tensor:
    """The next exponents from the votes summed over ranks (blocks × len(INT8_MOVES)): each
    block moves by the largest move any rank voted for; within ±``limit``."""
    moves = _moves(exponent.device)  # ascending: the largest voted is the largest with votes
    top = torch.where(counts > 0, moves, moves[0]).amax(dim=1)
    return (exponent + top).clamp_(-limit, limit)


def int8_cap(step: torch.Tensor, budget: int, dtype: torch.dtype) -> torch.Tensor:
    """Per block (in ``step``'s dtype), the largest level a rank may send: ``budget``, or
    fewer where ``budget``·step would pass the largest value of ``dtype`` (the bucket's):
    a level rounded up past it (65504 in fp16, 3.4e38 in fp32) would make the average of
    finite gradients inf. With every |level|·step at most that value, so is the average of
    every rank's. The quotient
    is shrunk by 2^-20 so that its own rounding, and the average's, cannot lift a level
    past it. 0 where one step is already past it (nothing of the block is sent; error
    feedback keeps it). No host read."""
    top = torch.finfo(dtype).max
    return torch.floor(top / step * (1 - 2.0**-20)).clamp_(max=budget)


def int8_quantize(x: torch.Tensor, inv: torch.Tensor, limit: int | torch.Tensor,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the levels in x's accumulation dtype, the same as int8): x·inv, each block of
    INT8_BLOCK elements by its own entry of ``inv``, clipped to ±``limit`` (one for all, or
    one per block, :func:`int8_cap`) and rounded to the nearest; written into ``out`` where
    given (:meth:`Int8.scratch`)."""
    acc = acc_dtype(x.dtype)
    if out is None:
        out = (torch.empty(x.numel(), dtype=acc, device=x.device),
               torch.empty(x.numel(), dtype=torch.int8, device=x.device))
    t, q = out
    if x.dtype != acc:  # multiplied in the accumulation dtype: fp16 holds levels to 1/16 only
        x = t.copy_(x)
    blocks.mul(x, inv, INT8_BLOCK, out=t)
    if isinstance(limit, torch.Tensor):
        for el, bl, shape in blocks.ranges(t.numel(), INT8_BLOCK):
            v, lim = t[el].view(shape), limit[bl, None]
            torch.clamp(v, -lim, lim, out=v)
    else:
        t.clamp_(-limit, limit)
    t.round_()
    return t, q.copy_(t)


def int8_inverse(bound: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inv, scale) for values of magnitude at most ``bound`` (per element of it): levels/bound
    and bound/levels; both 0 where the bound is 0, NaN or Inf, or so small that levels/bound
    overflows (a block of subnormal values: 0·inf would make NaN). Then nothing is sent, and
    error feedback keeps it all. No host read."""
    ok = (bound > 0) & bound.isfinite()
    safe = torch.where(ok, bound, torch.ones_like(bound))
    inv = levels / safe
    ok &= inv.isfinite()
    zero = torch.zeros_like(bound)
    scale = torch.where(ok, safe / levels, zero)
    # a bound within a rounding of the dtype's largest value: levels·scale rounded up to inf
    # (the top level decoded to inf); one step down it is at most the bound
    scale = torch.where((scale * levels).isfinite(), scale, scale.nextafter(zero))
    return torch.where(ok, inv, zero), scale


class Int8(Compressor):
    """x rounded to one of 255 levels per block of INT8_BLOCK elements (the block's largest
    |x| over 127), one byte each and one scale per block. Biased (it rounds); pair it with
    :class:`ErrorFeedback`. Its aggregation sums the int8 values of every rank in one
    allreduce with step sizes the ranks share (:mod:`gradwire.catalogue`), kept here per
    bucket from step to step (``exponents``, saved by :meth:`state_dict`)."""

    name = "int8"
    error_feedback = True

    def __init__(self) -> None:
        super().__init__()
        self.buffers: dict[object, tuple[torch.Tensor, torch.Tensor]] = {}
        # per bucket, each block's E: its step size is 2^(E/2) (int8_steps)
        self.exponents: dict[object, torch.Tensor] = {}

    def scratch(self, key: object, x: torch.Tensor, wire: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers for bucket ``key``: its levels (x's accumulation dtype, x's size) and the
        int8 wire of ``wire`` elements, kept from step to step (fresh ones would cost page
        faults at every step); made again when the bucket changes."""
        t, q = self.buffers.get(key, (None, None))
        if t is None or t.numel() != x.numel() or t.device != x.device or \
                t.dtype != acc_dtype(x.dtype) or q.numel() != wire:
            t, q = (torch.empty(x.numel(), dtype=acc_dtype(x.dtype), device=x.device),
                    torch.empty(wire, dtype=torch.int8, device=x.device))
            self.buffers[key] = (t, q)
        return t, q

    def forget(self, used: set) -> None:
        for kept in (self.buffers, self.exponents):
            for key in [k for k in kept if k not in used]:
                del kept[key]  # 5 bytes an element of scratch

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step, "exponents": dict(self.exponents)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Both fields read before either is set (as PowerSGD's): a malformed ``exponents``
        raised after the step was already loaded, leaving the compressor half loaded."""
        exponents = dict(state.get("exponents", {}))  # type: ignore[call-overload]
        super().load_state_dict(state)
        self.exponents = exponents

    def compress(self, x: torch.Tensor) -> Int8Payload:
        x = check_input(self.name, x)
        bound, _ = blocks.magnitude(x, INT8_BLOCK)
        inv, scale = int8_inverse(bound.to(acc_dtype(x.dtype)), INT8_MAX)
        _, values = int8_quantize(x, inv, INT8_MAX)
        return Int8Payload(dtype=x.dtype, values=values, scale=scale)

    def decompress(self, payload: Payload, numel: int) -> torch.Tensor:
        p = expect(self.name, payload, Int8Payload)
        out = torch.empty(p.values.numel(), dtype=p.scale.dtype, device=p.values.device)
        return blocks.mul(p.values, p.scale, INT8_BLOCK, out=out).to(p.dtype)

    def decompress_into(self, payload: Payload, out: torch.Tensor) -> torch.Tensor:
        p = expect(self.name, payload, Int8Payload)
        if p.values.numel() != out.numel():
            raise GradwireError(f"{self.name}: this payload holds {p.values.numel()} elements, "
                                f"not the {out.numel()} asked for")
        return blocks.mul(p.values, p.scale, INT8_BLOCK, out=out)

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return numel + acc_dtype(dtype).itemsize * blocks.count(numel, INT8_BLOCK)
