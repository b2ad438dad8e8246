"""Catching host-device synchronisations on a machine without a GPU.

On a CUDA tensor each call below makes the host wait for the GPU: it reads a value
(``item``, ``bool()``, ``int()``, ``float()``, ``tolist``, ``cpu``, ``numpy``), or its result has a
size that depends on the data (``nonzero``, ``unique``, masked selection with a bool index). On a
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
        for name in ("__getitem__", "__setitem__"):
            def make(original, name=name):  # type: ignore[no-untyped-def]
                def call(t, index, *rest):  # type: ignore[no-untyped-def]
                    if _bool_index(index):
                        self._record(f"Tensor.{name} with a bool mask")
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
