"""A hook state's checkpoint: what :meth:`HookState.state_dict` saves (warm-up position,
residuals and velocities per parameter position, compressor state) and
:meth:`HookState.load_state_dict` restores, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gradwire.check import is_int
from gradwire.compress.feedback import MALFORMED
from gradwire.errors import GradwireError
from gradwire.hooks import layout

if TYPE_CHECKING:
    from gradwire.hooks.state import HookState


def save(state: HookState) -> dict[str, Any]:
    """What :meth:`HookState.state_dict` returns."""
    numels = state.positions.numels
    residuals = layout.split(state.ef.residuals, numels) if state.ef else {}
    return {"method": state.config.method.name, "epoch": state.epoch, "step": state.step,
            # where the count of epochs stands: an epoch resumed half way ends on time
            "epoch_at": list(state._epoch_at), "residuals": residuals,
            "velocities": layout.split(state.velocities, numels),
            "order": state._resume_order or state._order,
            "compressor": state.compressor.state_dict() if state.compressor else {}}


def load(state: HookState, saved: dict[str, Any]) -> None:
    """``saved`` (what :func:`save` returned) loaded into ``state``; a ``saved`` that is
    refused leaves ``state`` as it was (:meth:`HookState.load_state_dict`)."""
    state._disjoint = {}  # whether loaded or restored, the dicts are new
    before = (state._epoch_at, state.step, state._resume_order, state.positions.counts(),
              dict(state.ef.residuals) if state.ef is not None else None,
              state.compressor.state_dict() if state.compressor is not None else None,
              dict(state.velocities))
    try:
        _load(state, saved)
    except Exception as e:  # an OverflowError too: int(inf) of a corrupt order or step
        state._epoch_at, state.step, state._resume_order = before[:3]
        state.positions.restore(before[3])
        if state.ef is not None:
            state.ef.residuals = before[4]  # type: ignore[assignment]
        if state.compressor is not None:
            state.compressor.load_state_dict(before[5])  # type: ignore[arg-type]
        state.velocities = before[6]  # type: ignore[assignment]
        if not isinstance(e, (*MALFORMED, OverflowError)):
            raise
        raise GradwireError(f"hook state_dict is malformed ({type(e).__name__}: {e}): "
                            "expected what state_dict() returned") from None


def _load(state: HookState, saved: dict[str, Any]) -> None:
    name = state.config.method.name
    if saved.get("method") != name:
        raise GradwireError(f"hook state_dict is for method {saved.get('method')!r}, this "
                            f"hook runs {name!r}")
    step = saved["step"]
    since = saved.get("epoch_at")  # absent from a state saved before it was kept
    epoch, began = (saved["epoch"], step) if since is None else tuple(since)
    if not all(is_int(v) for v in (step, epoch, began)):  # 2.7 or True is no count
        raise TypeError(f"step, epoch and epoch_at hold integers, got {step!r}, {epoch!r}, "
                        f"{began!r}")
    if not (step >= 0 and epoch >= 0 and 0 <= began <= step):
        raise GradwireError(f"hook state_dict: step {step}, epoch {epoch} from step {began}: "
                            "expected counts >= 0, the epoch begun at or before the step")
    state.step, state._epoch_at = step, (epoch, began)
    state.positions.take_parameters_counts()  # this state's residuals replace the last's
    order = saved.get("order")
    if order is not None and not isinstance(order, list | tuple):  # a tensor: no bool()
        got = "a tensor" if isinstance(order, torch.Tensor) else repr(order)  # one line
        raise TypeError(f"order is a list of parameter positions, got {got}")
    if order:
        bad = next((p for p in order if not is_int(p, 0)), None)
        if bad is not None or len(set(order)) != len(order):
            what = f"holds {bad!r}" if bad is not None else "names a position twice"
            raise GradwireError(f"hook state_dict: order {what}: expected each parameter "
                                "position (an integer >= 0) once")
    state._resume_order = tuple(int(p) for p in order) if order else None
    numels, resume = state.positions.numels, state._resume_order
    if state.ef is not None:
        state.ef.residuals = _per_position(saved["residuals"], "residual", numels, resume)
    # a state saved without momentum correction starts its velocities at zero
    state.velocities = (_per_position(saved.get("velocities", {}), "velocity", numels, resume)
                        if state.config.momentum else {})
    if state.compressor is not None:
        state.compressor.load_state_dict(saved["compressor"])
    state._loaded = True


def _per_position(tensors: dict[Any, torch.Tensor], what: str, numels: dict[int, int],
                  order: layout.Layout | None) -> dict[layout.Layout, torch.Tensor]:
    """A state_dict's tensors per parameter position, as one-parameter layouts, checked
    against (and recording in ``numels``) each position's element count, and against the
    saved model ``order`` where there is one."""
    out = {}
    for pos, t in tensors.items():
        if not is_int(pos, 0):
            raise GradwireError(f"hook state_dict: {what} of parameter {pos!r}: a "
                                "parameter position is an integer >= 0")
        if order is not None and pos not in order:
            raise GradwireError(f"hook state_dict: {what} of parameter {pos}, a position "
                                "its order does not name")
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise GradwireError(f"hook state_dict: {what} of parameter {pos} must be a "
                                f"float tensor, got {got}")
        known = numels.setdefault(int(pos), t.numel())
        if known != t.numel():
            raise GradwireError(f"hook state_dict: {what} of parameter {pos} has "
                                f"{t.numel()} elements, the model's has {known}")
        out[(int(pos),)] = t.detach().reshape(-1).clone()  # flat, whatever shape it came in
    return out
