"""Catching host-device synchronisations on a machine without a GPU.

On a CUDA tensor each call below makes the host wait for the GPU: it reads a value
(``item``, ``bool()``, ``int()``, ``float()``, ``tolist``, ``cpu``, ``numpy``), its result has a
size that depends on the data (``nonzero``, ``unique``, masked selection with a bool index), or it
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
                  "argwhere", "bincount", "__array__")
TORCH_FUNCTIONS = ("nonzero", "unique", "unique_consecutive", "masked_select", "argwhere",
                   "bincount")


def _bool_index(index: object) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _scalar_index(index: object) -> bool:
    """A 0-d integer tensor as an index: torch reads its value on the host in C++, past
    ``__index__`` (which a slice's tensor bound does call), a synchronisation on CUDA."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dim() == 0 and not p.is_floating_point()
               and p.dtype != torch.bool for p in parts)


def _number_put(index: object, value: object) -> bool:
    """``t[index] = <a Python number>`` at tensor indices or at one element: on a CUDA tensor
    torch makes the number a host tensor and copies it over (advanced indexing, or a 0-d
    destination), which waits for the GPU; a slice is filled on the device instead."""
    if not isinstance(value, (bool, int, float)):
        return False
    parts = index if isinstance(index, tuple) else (index,)
    return (any(isinstance(p, torch.Tensor) and p.dtype != torch.bool for p in parts)
            or all(isinstance(p, int) for p in parts))


def _list_index(index: object) -> bool:
    """A Python list as an index: torch makes a host tensor of it and copies that to the
    indexed tensor's device, which CUDA's debug mode counts as synchronising."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, list) for p in parts)


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
        for name in ("__getitem__", "__setitem__"):
            def make(original, name=name):  # type: ignore[no-untyped-def]
                def call(t, index, *rest):  # type: ignore[no-untyped-def]
                    if _bool_index(index):
                        self._record(f"Tensor.{name} with a bool mask")
                    elif _scalar_index(index):
                        self._record(f"Tensor.{name} with a 0-d tensor as an integer")
                    elif _list_index(index):
                        self._record(f"Tensor.{name} with a Python list")
                    elif name == "__setitem__" and rest and _number_put(index, rest[0]):
                        self._record("Tensor.__setitem__ of a Python number at tensor "
                                     "indices or one element")
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
