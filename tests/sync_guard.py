"""Catching host-device synchronisations on a machine without a GPU.

On a CUDA tensor each call below makes the host wait for the GPU: it reads a value
(``item``, ``bool()``, ``int()``, ``float()``, ``tolist``, ``cpu``, ``numpy``, ``equal``,
``allclose``), its result has a size that depends on the data (``nonzero``, ``unique``,
``where`` of a condition alone, masked selection with a bool index), or it
copies from the host and waits for the copy (``t[idx] = 0`` with tensor indices or at one
element, a Python list or a 0-d tensor as an index, ``torch.tensor`` of host data). On a
CPU tensor the same calls cost nothing, so :class:`SyncGuard` records them instead: within
``guard.watching()`` every such call, on any thread, is counted with where it was made.

Example::

    with SyncGuard() as guard, device_paths():
        with guard.watching():
            loss.backward()
    assert guard.calls == [], guard.report()
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Callable, Iterator

import torch

TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
                  "__index__", "nonzero", "unique", "unique_consecutive", "masked_select",
                  "argwhere", "bincount", "__array__", "equal", "allclose", "is_nonzero")
TORCH_FUNCTIONS = ("nonzero", "unique", "unique_consecutive", "masked_select", "argwhere",
                   "bincount", "equal", "allclose", "is_nonzero")


def _indexing_waits(name: str, index: object, rest: tuple[object, ...]) -> str | None:
    """Why ``t[index]`` (``name`` "__getitem__") or ``t[index] = rest[0]`` ("__setitem__")
    waits for the GPU on a CUDA tensor, or None where it does not:

    - a bool mask: the result's size depends on the data;
    - a 0-d integer tensor as an index: torch reads its value on the host in C++, past
      ``__index__`` (which a slice's tensor bound does call);
    - a Python list as an index: torch makes a host tensor of it and copies it over;
    - a Python number put at tensor indices or at one element: torch makes the number a host
      tensor and copies it over (advanced indexing, or a 0-d destination); a slice is filled on
      the device instead."""
    parts = index if isinstance(index, tuple) else (index,)
    tensors = [q for q in parts if isinstance(q, torch.Tensor)]
    if any(q.dtype == torch.bool for q in tensors):
        return f"Tensor.{name} with a bool mask"
    if any(q.dim() == 0 and not q.is_floating_point() for q in tensors):
        return f"Tensor.{name} with a 0-d tensor as an integer"
    if any(isinstance(q, list) for q in parts):
        return f"Tensor.{name} with a Python list"
    if (name == "__setitem__" and rest and isinstance(rest[0], (bool, int, float))
            and (tensors or all(isinstance(q, int) for q in parts))):
        return "Tensor.__setitem__ of a Python number at tensor indices or one element"
    return None


class SyncGuard:
    """Patches the synchronising calls of torch while entered; counts them while watching."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (call, where: the innermost frames)
        self._watching = threading.Event()
        self._saved: list[tuple[object, str, object]] = []
        self._lock = threading.Lock()

    def _record(self, name: str) -> None:
        if not self._watching.is_set():
            return
        frames = traceback.extract_stack()[:-2]
        where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                            for f in reversed(frames[-6:]))
        with self._lock:
            self.calls.append((name, where))

    def _wrap(self, owner: object, name: str, make: Callable[[object], object]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def __enter__(self) -> SyncGuard:
        def counted(name: str) -> Callable[[object], object]:
            def make(original):  # type: ignore[no-untyped-def]
                def call(*args, **kwargs):  # type: ignore[no-untyped-def]
                    self._record(name)
                    return original(*args, **kwargs)
                return call
            return make

        for name in TENSOR_METHODS:
            if hasattr(torch.Tensor, name):
                self._wrap(torch.Tensor, name, counted(f"Tensor.{name}"))
        for name in TORCH_FUNCTIONS:
            self._wrap(torch, name, counted(f"torch.{name}"))
        for name in ("tensor", "as_tensor"):  # from host data: a copy to the device
            def make(original, name=name):  # type: ignore[no-untyped-def]
                def call(data, *rest, **kwargs):  # type: ignore[no-untyped-def]
                    if not isinstance(data, torch.Tensor):
                        self._record(f"torch.{name} of host data")
                    return original(data, *rest, **kwargs)
                return call
            self._wrap(torch, name, make)
        def where(original):  # type: ignore[no-untyped-def]
            def call(*args, **kwargs):  # type: ignore[no-untyped-def]
                if len(args) + len(kwargs) == 1:  # torch.where(cond) is nonzero: a size read
                    self._record("torch.where of a condition alone")
                return original(*args, **kwargs)
            return call

        self._wrap(torch, "where", where)
        for name in ("__getitem__", "__setitem__"):
            def make(original, name=name):  # type: ignore[no-untyped-def]
                def call(t, index, *rest):  # type: ignore[no-untyped-def]
                    why = _indexing_waits(name, index, rest)
                    if why:
                        self._record(why)
                    return original(t, index, *rest)
                return call
            self._wrap(torch.Tensor, name, make)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self._watching.set()
        try:
            yield
        finally:
            self._watching.clear()

    def report(self) -> str:
        return "\n".join(f"{name}: {where}" for name, where in self.calls)
