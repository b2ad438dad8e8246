"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019): what a compressor dropped this
step is added to the gradient of the next, so no gradient mass is ever lost.

Per key (a bucket index, a parameter name), with residual e (zero at first):

1. corrected = g + e
2. payload = compress(corrected)
3. e = corrected − decompress(payload)

so e_after + decompress(payload) = e_before + g element-wise (exactly, for values whose sums are
representable). Where corrected − decompress(payload) passes the dtype's largest value (an
approximation on the other side of zero near it: PowerSGD's), e keeps ± that value, the most
it can hold, and the part beyond is lost (:func:`unapplied`): ±inf there would make every
later gradient + residual inf. The residual has the gradient's dtype and device. One
ErrorFeedback serves every compressor; compressors keep none of their own. A top-k selection
does steps 1–3 in place in the residual (:func:`feed`), which
:func:`gradwire.sparse.sparse_allreduce` also uses.

The NaN/Inf policy, here once for the hooks and :func:`gradwire.sparse.sparse_allreduce`.
Every rank finds the :class:`Status` of its gradient x and residual e, the ranks learn the
worst, and every rank then takes the same path:

1. OK everywhere: compress with error feedback as usual.
2. NONFINITE anywhere (x holds NaN or Inf): every rank sums x + e dense, as a dense
   allreduce would (GradScaler then skips the step), and its residual is cleared.
3. OVERFLOW anywhere, NONFINITE nowhere (x is finite, x + e overflows x's dtype): the bucket
   is summed dense. With the status carried with the data (below), a rank whose x + e
   overflows sums x alone and keeps e untouched, the others sum x + e and clear theirs; with
   the status agreed in the header (:func:`fallback`), every rank sums x alone and keeps its
   e. Either way e_after + applied = e_before + x exactly, and nothing non-finite is applied
   or kept.

Top-k, gTop-k, int8 and PowerSGD carry the status with the data (:func:`local_status`,
:func:`add_kept`, :func:`settle`): a rank whose x + e would overflow leaves x out of its
accumulator (so e stays as it was), every rank compresses and sends as usual with its status
beside the payload, and once the worst is known the rare non-OK bucket is summed again,
dense. Nothing is exchanged before the data, and on a GPU the worst is read once per training
step (:mod:`gradwire.hooks`). On the host the status is exact; on a device it comes from the
largest magnitudes alone (no host read): a bucket whose largest |x| plus largest |e| overflows
counts as overflowing even where no single x_i + e_i does (then it is summed dense that step,
and nothing is lost).

The other compressors agree on the status in the call's header exchange
(:func:`gradwire.collectives.agree.agree_status`) before compressing (:func:`status`,
:func:`fallback`). With the header exchange off (``GRADWIRE_CHECK_CALLS=0``) those ranks
cannot agree on a dense call, so every rank compresses as usual and NaN or Inf in x goes
through the compressor as it is; a rank whose x + e would overflow drops its residual first
(zeroed, with a warning: its mass is lost) and compresses x alone. Such a call leaves NaN or
Inf in the residual (where x's were not sent, and where they were: corrected − sent is NaN),
which no later call could apply or clear; the next call zeroes those elements of it first
(with a warning), so the run recovers one call after its last non-finite gradient.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Hashable

import torch

from gradwire.compress import blocks
from gradwire.compress.base import Compressor, Payload
from gradwire.compress.select import select
from gradwire.errors import GradwireError
from gradwire.syncfree import on_host

# What a state dict that is not what state_dict() returned raises on the way in (a missing key,
# a field of the wrong type or value): callers turn it into one GradwireError.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError)


def feed(residual: torch.Tensor, x: torch.Tensor, k: int, selector: str = "exact",
         keep: bool | torch.Tensor = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1–3 for a top-k selection, in place: acc = residual + x (in ``residual``; residual
    alone where ``keep`` is false, :func:`add_kept`); select the min(k, n) largest |acc|
    (:func:`gradwire.compress.select.select`); residual = acc − sent. Returns what this rank
    sends: (values, int64 indices); putting the values back at the indices restores acc."""
    acc = add_kept(residual, x, keep)
    idx = select(acc, k, selector)
    values = acc[idx]
    # acc − sent, exactly (the sent values are acc's own); index_fill_ takes the zero as an
    # argument, where acc[idx] = 0 would copy it from the host and wait for the GPU
    acc.index_fill_(0, idx, 0)
    return values, idx


def unapplied(acc: torch.Tensor, applied: torch.Tensor) -> torch.Tensor:
    """The residual acc − applied, in place in ``acc`` (returned), within ± the largest value
    of acc's dtype.

    Exact wherever the difference fits. Where acc and applied are finite but further apart
    than the dtype holds (PowerSGD's approximation, bounded by the largest value, on the other
    side of zero from an acc near it), the residual saturates at ± the largest value: it keeps
    all the mass it can and drops what lies beyond (±inf there would make every later
    gradient + residual inf). One clamp pass after the subtraction, no host read.

    For a finite acc: a ±inf in acc would be kept as ± the largest value, where the NaN/Inf
    policy (:func:`settle`, :func:`fallback`) must find it non-finite to clear it; NaN stays
    NaN (PowerSGD's P·Qᵀ of a matrix holding ±inf is NaN throughout)."""
    top = torch.finfo(acc.dtype).max
    return acc.sub_(applied.to(acc.dtype)).clamp_(-top, top)


def flush(residual: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """x + residual as a new tensor (x when there is none): all of it is applied now."""
    return x if residual is None else x + residual.to(x.dtype)


class Status(enum.IntEnum):
    """One rank's bucket under the NaN/Inf policy; the ranks take the worst path any needs."""

    OK = 0
    OVERFLOW = 1  # x is finite, x + residual is not
    NONFINITE = 2  # x (or, after a call with the header exchange off, the residual) is not


def _extremes(x: torch.Tensor, residual: torch.Tensor | None, block: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(X + E, the ends): the largest |x| plus the largest |e| (1-D: one element, or one per
    block of ``block`` elements, :mod:`gradwire.compress.blocks`), and x's and e's minimum
    and maximum in x's dtype (1-D). One aminmax pass over each (it propagates NaN); nothing is
    read on the host."""
    bound, ends = blocks.magnitude(x, block)
    if residual is not None and residual.numel():
        e_bound, e_ends = (t.to(x.dtype) for t in blocks.magnitude(residual, block))
        ends = torch.cat([ends, e_ends])
        bound = bound + e_bound
    return bound, ends


def status(x: torch.Tensor, residual: torch.Tensor | None = None) -> Status:
    """The :class:`Status` of ``x`` with ``residual`` (None: no residual), exactly.

    One pass over each, no copy, one host sync: the largest magnitudes X of x and E of e
    (aminmax, which propagates NaN). If X + E is finite in x's dtype, every x_i + e_i is
    (rounding is monotonic). Only otherwise, near the dtype's limit or with NaN or Inf, is
    x + e formed to decide (the rare path).
    """
    if x.numel() == 0:
        return Status.OK
    return _status(x, residual, *_extremes(x, residual))


def _status(x: torch.Tensor, residual: torch.Tensor | None, bound: torch.Tensor,
            ends: torch.Tensor) -> Status:
    """:func:`status` from :func:`_extremes`."""
    finite = torch.cat([bound.isfinite().all().reshape(1), ends.isfinite()]).tolist()
    if finite[0]:
        return Status.OK
    if not all(finite[1:]):
        return Status.NONFINITE
    assert residual is not None  # x alone is finite, so its bound was
    return Status.OK if bool(torch.isfinite(x + residual).all()) else Status.OVERFLOW


def local_status(x: torch.Tensor, residual: torch.Tensor | None
                 ) -> tuple[int | torch.Tensor, bool | torch.Tensor]:
    """(this rank's :class:`Status`, whether x goes into its accumulator: not when x + e
    overflows). On the host: an int and a bool, exactly (:func:`status`). On a device: 0-d
    uint8 and bool tensors, with no host read, from the largest magnitudes alone (the
    module docstring)."""
    mine, keep, _ = local_status_bound(x, residual)
    return mine, keep


def local_status_bound(x: torch.Tensor, residual: torch.Tensor | None,
                       block: int | None = None
                       ) -> tuple[int | torch.Tensor, bool | torch.Tensor, torch.Tensor]:
    """:func:`local_status` and, from the same passes, the largest |x| plus the largest |e|
    (1-D, x's dtype, not read; one element, or one per block of ``block`` elements): a bound
    on every |x_i + e_i| of its block as x's dtype rounds it."""
    if x.numel() == 0:
        bound = torch.zeros(1 if block is None else 0, dtype=x.dtype, device=x.device)
        if on_host(x):
            return int(Status.OK), True, bound
        zero = torch.zeros((), dtype=torch.uint8, device=x.device)
        return zero, torch.ones((), dtype=torch.bool, device=x.device), bound
    bound, ends = _extremes(x, residual, block)
    if on_host(x):
        mine = _status(x, residual, bound, ends)
        return int(mine), mine is not Status.OVERFLOW, bound
    nonfinite = ~ends.isfinite().all()
    overflow = ~nonfinite & ~bound.isfinite().all()
    mine = nonfinite.to(torch.uint8) * int(Status.NONFINITE) + overflow.to(torch.uint8)
    return mine, ~overflow, bound


def add_kept(residual: torch.Tensor, x: torch.Tensor, keep: bool | torch.Tensor
             ) -> torch.Tensor:
    """acc = residual + x in place in ``residual``, or residual unchanged where ``keep`` is
    false (x + residual would overflow); ``keep`` a bool, or a 0-d bool tensor (one fused
    pass, no host read: x·0 adds an exact zero, x being finite whenever keep is false)."""
    if isinstance(keep, torch.Tensor):
        return residual.addcmul_(x, keep.to(residual.dtype))
    return residual.add_(x) if keep else residual


def settle(worst: int, x: torch.Tensor, acc: torch.Tensor, residual: torch.Tensor | None,
           keep: bool | torch.Tensor, who: str) -> torch.Tensor:
    """What this rank sums dense when the ranks' ``worst`` status is not OK (the module
    docstring), as a new tensor; ``residual`` is cleared or kept in place to match.

    ``acc`` is e + x (e alone where ``keep`` is false), with whatever was selected from it put
    back; it may be ``residual`` itself. Warns (RuntimeWarning)."""
    keep = torch.as_tensor(keep, device=x.device)  # a bool from the host path; as is on a device
    if worst == Status.NONFINITE:
        _warn(who, "a gradient holds NaN or Inf on some rank; aggregated dense this call "
              "(residuals applied and cleared)")
        # without a residual nothing can overflow: keep is true and acc is x
        out = acc.clone() if residual is None else torch.where(keep, acc, x + residual)
        if residual is not None:
            residual.zero_()
        return out
    _warn(who, f"gradient + residual overflows {_name(x.dtype)} on some rank; aggregated dense "
          "this call (where it overflows: the gradient alone, the residual kept; elsewhere: "
          "both, the residual cleared)")
    out = torch.where(keep, acc, x)
    if residual is not None:
        residual.masked_fill_(keep, 0)
    return out


def fallback(worst: int | None, x: torch.Tensor, residual: torch.Tensor | None,
             who: str) -> torch.Tensor | None:
    """The NaN/Inf policy (module docstring) for ``worst``, the worst :class:`Status` the
    ranks agreed on (None: the header exchange is off). Returns a new tensor for every rank
    to sum dense this call instead of compressing, or None to compress as usual; clears
    ``residual`` (zeroed, in place) where the policy says so. Warns (RuntimeWarning) when it
    acts."""
    if worst is None:
        if residual is None:
            return None
        mine = status(x, residual)
        if mine is Status.NONFINITE and not bool(residual.isfinite().all()):
            # Left by an earlier call that compressed NaN or Inf as it was: kept, it would be
            # added to every later gradient (NaN forever), and nothing else clears it here.
            _warn(who, "the residual holds NaN or Inf (a gradient compressed with the header "
                  "exchange off, GRADWIRE_CHECK_CALLS=0, held them): those elements of it "
                  "were dropped")
            residual.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            mine = status(x, residual)
        if mine is Status.OVERFLOW:
            _warn(who, f"gradient + residual overflows {_name(x.dtype)} on this rank and the "
                  "header exchange is off (GRADWIRE_CHECK_CALLS=0), so the ranks cannot agree "
                  "on a dense call: its residual was dropped (that mass is lost) and the "
                  "gradient compressed alone")
            residual.zero_()
        return None
    if worst == Status.OK:
        return None
    if worst == Status.OVERFLOW:
        _warn(who, f"gradient + residual overflows {_name(x.dtype)} on some rank; aggregated "
              "dense this call, without the residuals (kept)")
        return x.clone()
    _warn(who, "a gradient holds NaN or Inf on some rank; aggregated dense this call "
          "(residuals applied and cleared)")
    out = x.clone() if residual is None else flush(residual, x)
    if residual is not None:
        residual.zero_()
    return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _warn(who: str, what: str) -> None:
    # user -> sparse_allreduce or start -> fallback -> _warn: name the caller's caller
    warnings.warn(f"{who}: {what}", RuntimeWarning, stacklevel=4)


class ErrorFeedback:
    """Residuals per key for one compressor.

    Example::

        ef = ErrorFeedback(TopK(density=0.001))
        payload = ef.compress(bucket.index(), bucket.buffer())   # send payload.tensors()

    For schemes that do not fit compress/decompress (PowerSGD's steps), use the two halves:
    ``corrected = ef.correct(key, g)`` … ``ef.update(key, corrected, applied)``.
    """

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self.residuals: dict[Hashable, torch.Tensor] = {}

    def correct(self, key: Hashable, g: torch.Tensor) -> torch.Tensor:
        """g + residual of ``key``, as a new tensor (g is never modified)."""
        e = self._get(key, g)
        if e is None:
            return g.clone()
        return g + e.to(g.device)

    def _get(self, key: Hashable, g: torch.Tensor) -> torch.Tensor | None:
        """The residual of ``key`` (None: none yet), refused where it is not of ``g``'s shape
        and dtype: a stale one would broadcast into g, or round away its mass."""
        e = self.residuals.get(key)
        if e is not None and (e.shape != g.shape or e.dtype != g.dtype):
            raise GradwireError(
                f"error feedback key {key!r}: residual is {tuple(e.shape)} {e.dtype} but the "
                f"gradient is {tuple(g.shape)} {g.dtype}; buckets changed (DDP rebuilds them "
                f"after the first iterations): call reset() when they do")
        return e

    def update(self, key: Hashable, corrected: torch.Tensor, applied: torch.Tensor) -> None:
        """residual of ``key`` = corrected − applied, computed in place in ``corrected``; for a
        compressor whose ``residual_may_overflow`` (PowerSGD), within ± the dtype's largest
        value (:func:`unapplied`: saturated where corrected − applied passes it)."""
        if self.compressor.residual_may_overflow:
            self.residuals[key] = unapplied(corrected, applied)
        else:  # the difference never passes the largest value: no pass to bound it
            self.residuals[key] = corrected.sub_(applied.to(corrected.dtype))

    def compress(self, key: Hashable, g: torch.Tensor) -> Payload:
        """Steps 1–3 of the module docstring; returns the payload to send."""
        corrected = self.correct(key, g)
        payload = self.compressor.compress(corrected)
        self.update(key, corrected, self.compressor.decompress(payload, corrected.numel()))
        return payload

    def residual(self, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The residual of ``key``, zeros like ``like`` the first time (kept, and updated in
        place by :func:`feed`)."""
        e = self._get(key, like)
        if e is None:
            e = self.residuals[key] = torch.zeros_like(like)
        return e

    def flush(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        """x plus the residual of ``key``, which is then zero (all of it is applied), for a
        dense call. It is kept, zeroed, not forgotten: a key that names a new bucket layout
        carried its residual over from the old layout's, which would otherwise still hold it
        and hand it over again (gradient mass made at every step after DDP rebuilt its
        buckets).

        Where x + e would overflow x's dtype (:func:`local_status`; on a device from the
        largest magnitudes, no host read) x alone is returned and e kept as it is, as the
        NaN/Inf policy's dense path does: a call that goes dense without a status (the
        warm-up's dense steps, a bucket no compression makes smaller, of a method whose
        status travels with its data) then neither applies an inf made of finite values
        nor loses e. Every rank decides for itself: the call is dense either way."""
        e = self._get(key, x)
        if e is None:
            return x
        _, keep = local_status(x, e)
        if isinstance(keep, torch.Tensor):  # on a device: chosen there, nothing read
            out = torch.where(keep, x + e, x)
            e.masked_fill_(keep, 0)
            return out
        if not keep:
            return x
        out = flush(e, x)
        e.zero_()
        return out

    def reset(self, key: Hashable | None = None) -> None:
        """Forget the residual of ``key``, or of every key."""
        if key is None:
            self.residuals.clear()
        else:
            self.residuals.pop(key, None)

    def state_dict(self) -> dict[str, object]:
        # copies: the residuals change in place from step to step
        return {"residuals": {k: v.clone() for k, v in self.residuals.items()},
                "compressor": self.compressor.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s residuals and compressor memory; all or nothing (a
        malformed state is a GradwireError and leaves both as they were)."""
        saved = (self.residuals, self.compressor.state_dict())
        try:
            residuals = dict(state["residuals"])  # type: ignore[call-overload]
            if not all(isinstance(t, torch.Tensor) for t in residuals.values()):
                raise TypeError("residuals must be tensors")
            residuals = {k: t.clone() for k, t in residuals.items()}  # not the caller's
            self.compressor.load_state_dict(state["compressor"])  # type: ignore[arg-type]
            self.residuals = residuals
        except MALFORMED as e:
            self.residuals = saved[0]
            self.compressor.load_state_dict(saved[1])
            raise GradwireError(f"error-feedback state_dict is malformed ({type(e).__name__}: "
                                f"{e}): expected what state_dict() returned") from None
