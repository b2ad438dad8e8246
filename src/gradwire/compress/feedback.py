"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019): what a compressor dropped this
step is added to the gradient of the next, so no gradient mass is ever lost.

Per key (a bucket index, a parameter name), with residual e (zero at first):

1. corrected = g + e
2. payload = compress(corrected)
3. e = corrected − decompress(payload)

so e_after + decompress(payload) = e_before + g element-wise (exactly, for values whose sums are
representable). The residual has the gradient's dtype and device. One ErrorFeedback serves every
compressor; compressors keep none of their own. A top-k selection does steps 1–3 in place in
the residual (:func:`feed`), which :func:`gradwire.sparse.sparse_allreduce` also uses.

The NaN/Inf policy (:func:`warn_nonfinite`): when any rank's gradient is not finite, every
rank aggregates gradient + residual dense, as a dense allreduce would, and its residual is
cleared, never left non-finite.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable

import torch

from gradwire.compress.base import Compressor, Payload
from gradwire.compress.select import select
from gradwire.errors import GradwireError

# What a state dict that is not what state_dict() returned raises on the way in (a missing key,
# a field of the wrong type or value): callers turn it into one GradwireError.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError)


def feed(residual: torch.Tensor, x: torch.Tensor, k: int, selector: str = "exact"
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1–3 for a top-k selection, in place: acc = residual + x (in ``residual``); select
    the min(k, n) largest |acc| (:func:`gradwire.compress.select.select`); residual = acc −
    sent. Returns what this rank sends: (values, int64 indices)."""
    acc = residual.add_(x)
    idx = select(acc, k, selector)
    values = acc[idx]
    acc[idx] = 0  # acc − sent, exactly: the sent values are acc's own
    return values, idx


def flush(residual: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """x + residual as a new tensor (x when there is none): all of it is applied now."""
    return x if residual is None else x + residual.to(x.dtype)


def warn_nonfinite(who: str, stacklevel: int = 3) -> None:
    """The NaN/Inf policy's one warning, on every rank that takes the dense path."""
    warnings.warn(f"{who}: a gradient holds NaN or Inf on some rank; aggregated dense this "
                  "call (residuals applied and cleared)", RuntimeWarning, stacklevel=stacklevel)


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
        e = self.residuals.get(key)
        if e is None:
            return g.clone()
        if e.shape != g.shape or e.dtype != g.dtype:
            raise GradwireError(
                f"error feedback key {key!r}: residual is {tuple(e.shape)} {e.dtype} but the "
                f"gradient is {tuple(g.shape)} {g.dtype}; buckets changed (DDP rebuilds them "
                f"after the first iterations): call reset() when they do")
        return g + e.to(g.device)

    def update(self, key: Hashable, corrected: torch.Tensor, applied: torch.Tensor) -> None:
        """residual of ``key`` = corrected − applied, computed in place in ``corrected``."""
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
        e = self.residuals.get(key)
        if e is None:
            e = self.residuals[key] = torch.zeros_like(like)
        return e

    def flush(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        """x plus the residual of ``key``, which is then zero (all of it is applied). It is
        kept, zeroed, not forgotten: a key that names a new bucket layout carried its
        residual over from the old layout's, which would otherwise still hold it and hand
        it over again (gradient mass made at every step after DDP rebuilt its buckets)."""
        e = self.residuals.get(key)
        out = flush(e, x)
        if e is not None:
            e.zero_()
        return out

    def reset(self, key: Hashable | None = None) -> None:
        """Forget the residual of ``key``, or of every key."""
        if key is None:
            self.residuals.clear()
        else:
            self.residuals.pop(key, None)

    def state_dict(self) -> dict[str, object]:
        return {"residuals": dict(self.residuals), "compressor": self.compressor.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s residuals and compressor memory; all or nothing (a
        malformed state is a GradwireError and leaves both as they were)."""
        saved = (self.residuals, self.compressor.state_dict())
        try:
            residuals = dict(state["residuals"])  # type: ignore[call-overload]
            if not all(isinstance(t, torch.Tensor) for t in residuals.values()):
                raise TypeError("residuals must be tensors")
            self.compressor.load_state_dict(state["compressor"])  # type: ignore[arg-type]
            self.residuals = residuals
        except MALFORMED as e:
            self.residuals = saved[0]
            self.compressor.load_state_dict(saved[1])
            raise GradwireError(f"error-feedback state_dict is malformed ({type(e).__name__}: "
                                f"{e}): expected what state_dict() returned") from None
