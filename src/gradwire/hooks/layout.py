"""Stable names for DDP's parameters and buckets, and per-bucket state that survives DDP
rebuilding its buckets.

DDP builds its buckets once at construction and again after the first iteration (in the order
the gradients became ready), so a bucket's index names different parameters before and after.
A bucket is named here by its *layout*: the positions of its parameters, in buffer order. A
parameter's position is the order in which the hook first saw it (the buckets of iteration 0,
which depend only on the model and DDP's settings, so a resumed run numbers them alike).
When a layout is new, :func:`carry` moves each parameter's residual over from the layout that
held it, so no error-feedback mass is lost in the rebuild.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gradwire.errors import GradwireError

Layout = tuple[int, ...]


class Positions:
    """Position and element count of every parameter the hook has seen."""

    def __init__(self) -> None:
        self._by_id: dict[int, int] = {}
        self.numels: dict[int, int] = {}
        self.shapes: dict[int, tuple[int, ...]] = {}
        # where a parameter has another element count than its position's (a state_dict's):
        # the parameter's
        self._contradicted: dict[int, int] = {}

    def layout(self, params: Iterable[torch.Tensor]) -> Layout:
        """The positions of ``params``, a bucket's parameters in buffer order. A parameter's
        elements and shape are those it takes in DDP's bucket: a complex one's real view
        (twice the elements, a trailing 2). Every parameter is given its position, but a
        parameter whose element count is not the one known for its position (a state_dict's)
        fails the bucket, recording no count or shape of it but that parameter's count, which
        the next state_dict loaded is checked against (:meth:`take_parameters_counts`)."""
        params = list(params)
        held = [torch.view_as_real(p.detach()) if p.is_complex() else p for p in params]
        # id(): the bucket hands back the model's own Parameter objects, which live as long as
        # the model; data_ptr() would change under `p.data = ...`. Named even where the bucket
        # fails, so that the names stay those of the first step's buckets.
        key = tuple(self._by_id.setdefault(id(p), len(self._by_id)) for p in params)
        # every contradicted parameter of the bucket is recorded, not only the first named:
        # the next state_dict is checked against each of them
        contradicted = {pos: h.numel() for pos, h in zip(key, held, strict=True)
                        if self.numels.get(pos, h.numel()) != h.numel()}
        if contradicted:
            self._contradicted.update(contradicted)
            pos, n = next(iter(contradicted.items()))
            raise GradwireError(f"parameter at position {pos} has {n} elements, the hook's "
                                f"state has {self.numels[pos]} for it (a state_dict of another "
                                "model?)")
        for pos, h in zip(key, held, strict=True):
            self.numels.setdefault(pos, h.numel())
            if pos not in self.shapes:  # once: a step's buckets name the same parameters
                self.shapes[pos] = _bucket_shape(h)
        return key

    def take_parameters_counts(self) -> None:
        """Where a parameter's element count contradicted the one a state_dict gave for its
        position (:meth:`layout` failed), the parameter's from now on: a state_dict loaded
        next is checked against the model, not against the mistaken one (whose tensors it
        replaces)."""
        self.numels.update(self._contradicted)
        self._contradicted = {}

    def counts(self) -> tuple[dict[int, int], dict[int, int]]:
        """The element counts, and those parameters contradicted (for :meth:`restore`)."""
        return dict(self.numels), dict(self._contradicted)

    def restore(self, counts: tuple[dict[int, int], dict[int, int]]) -> None:
        """The element counts as :meth:`counts` returned them."""
        self.numels.clear()
        self.numels.update(counts[0])
        self._contradicted = dict(counts[1])

    def position(self, p: torch.Tensor) -> int:
        """The position of ``p``, as the keys of ``HookState.state_dict()['residuals']``."""
        try:
            return self._by_id[id(p)]
        except KeyError:
            raise GradwireError("this parameter has not been through the hook yet") from None

    def shapes_of(self, layout: Layout) -> tuple[tuple[int, ...], ...] | None:
        """The shapes of ``layout``'s parameters in order; None if one is not known (a
        position restored from a state dict and not seen since)."""
        if not all(p in self.shapes for p in layout):
            return None
        return tuple(self.shapes[p] for p in layout)

    def size(self, layout: Layout) -> int:
        return sum(self.numels[p] for p in layout)


def bucket_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The strides of ``t``'s view of its DDP bucket (``t`` real: a complex parameter's
    ``view_as_real``): DDP lays a dense, non-overlapping parameter out in its memory order
    (its bucket view has the parameter's strides: channels_last, transposed), any other
    C-contiguously (``preserve_format``)."""
    return torch.empty_like(t, device="meta", memory_format=torch.preserve_format).stride()


def _bucket_shape(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s shape as its elements lie in DDP's bucket (:func:`bucket_strides`): a
    transposed matrix lies there as its transpose."""
    if t.is_contiguous():
        return tuple(t.shape)
    strides = bucket_strides(t)
    dims = sorted(range(t.dim()), key=lambda d: -strides[d])  # stable: ties keep order
    return tuple(t.shape[d] for d in dims)


def where(residuals: dict[Layout, torch.Tensor],
          numels: dict[int, int]) -> dict[int, tuple[Layout, int]]:
    """For each position, the layout holding its current residual and the offset there. Layouts
    are scanned in insertion order, so a parameter found in two takes the newer."""
    found: dict[int, tuple[Layout, int]] = {}
    for layout in residuals:
        offset = 0
        for pos in layout:
            found[pos] = (layout, offset)
            offset += numels[pos]
    return found


def carry(residuals: dict[Layout, torch.Tensor], layout: Layout, numels: dict[int, int],
          like: torch.Tensor, disjoint: bool = False) -> bool:
    """Give ``layout`` a residual assembled from its parameters' residuals in other layouts
    (zeros for those that have none), then drop layouts none of whose parameters live there any
    more. Nothing else happens when ``layout`` is known and holds its parameters' current
    residuals (its residual only moves to ``like``'s device and dtype, as one loaded with
    ``map_location="cpu"`` or saved from a model in another precision must) or none of its
    parameters has a residual.

    A known layout a newer one took parameters from (a step that failed part way through
    DDP's rebuilt buckets, then a new DDP of the model, whose first buckets are the old ones)
    is assembled afresh: used as it is, its stale copies would be sent again (mass made) and
    what it then kept of them lost (:func:`where` reads the newer).

    Returns whether the layouts of ``residuals`` are now pairwise disjoint, none superseded;
    ``disjoint`` True says the caller knows they were (what the last call returned, the dict
    changed since only by new keys none of whose parameters had a residual, by values and by
    removals), which skips the check: a step's checks then cost nothing, where each would
    otherwise read every newer layout."""
    if layout in residuals:
        disjoint = disjoint or _disjoint(residuals)
        if disjoint or not _superseded(residuals, layout):
            r = residuals[layout]
            if r.device != like.device or r.dtype != like.dtype:
                residuals[layout] = r.to(like.device, like.dtype)
            return disjoint
    if not residuals:
        return True
    found = where(residuals, numels)
    if not any(pos in found for pos in layout):
        return disjoint or _disjoint(residuals)
    new = like.new_zeros(sum(numels[p] for p in layout))
    offset = 0
    for pos in layout:
        n = numels[pos]
        if pos in found:
            old, at = found[pos]
            new[offset : offset + n] = residuals[old][at : at + n]
        found[pos] = (layout, offset)
        offset += n
    residuals.pop(layout, None)  # inserted anew: the newest, which where() reads
    residuals[layout] = new
    live = {old for old, _ in found.values()}
    for old in [k for k in residuals if k not in live]:
        del residuals[old]
    return _disjoint(residuals)


def _disjoint(residuals: dict[Layout, torch.Tensor]) -> bool:
    """Whether no parameter lies in two layouts of ``residuals``."""
    return sum(map(len, residuals)) == len(set().union(*residuals))


def _superseded(residuals: dict[Layout, torch.Tensor], layout: Layout) -> bool:
    """Whether a layout newer than ``layout`` (a key of ``residuals``) holds one of its
    parameters. Only the newer ones are read, a set lookup per parameter of theirs and no
    tensor work; needed only while two layouts overlap (:func:`carry`)."""
    mine: set[int] | None = None
    for key in reversed(residuals):
        if key == layout:
            return False
        mine = set(layout) if mine is None else mine
        if not mine.isdisjoint(key):
            return True
    return False


def split(residuals: dict[Layout, torch.Tensor],
          numels: dict[int, int]) -> dict[int, torch.Tensor]:
    """Each parameter's current residual, by position (copies)."""
    return {pos: residuals[old][at : at + numels[pos]].clone()
            for pos, (old, at) in where(residuals, numels).items()}
