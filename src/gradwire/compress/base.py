"""The compressor interface, the payload it puts on the wire, and the helpers every family shares.

A compressor turns a 1-D gradient bucket into a :class:`Payload` (the tensors that travel) and
back. It keeps no error feedback of its own (that is :class:`gradwire.compress.ErrorFeedback`).
What it keeps is a step counter that seeds its randomness, so two ranks that make the same
calls draw the same numbers, and what a method carries from one call to the next (PowerSGD's
warm-start Q, int8's step sizes, random-k's index cache), the same on every such rank; its
``state_dict`` holds what a resumed run needs.

Contract, held by ``tests/test_compress.py`` for every registered compressor:
- ``compress(x)`` accepts any 1-D float tensor (fp16, bf16, fp32, fp64) of any length, 0 included,
  and never returns a tensor that aliases ``x``;
- ``decompress(payload, numel)`` returns a dense tensor of ``numel`` elements in ``x``'s dtype;
- ``wire_bytes(numel, dtype)`` equals the sum of ``nbytes`` of ``payload.tensors()``;
- ``associative`` is True only when payloads of several ranks can be summed element-wise on the
  wire (an allreduce) and the sum decompresses to the sum of what each rank meant. Otherwise
  the payloads must be gathered and decompressed one by one (cost grows with the world size).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TypeVar

import torch

from gradwire.check import check_int, is_int
from gradwire.dtypes import FLOATS, acc_dtype
from gradwire.errors import GradwireError


@dataclass(frozen=True, kw_only=True)
class Payload:
    """What one rank sends for one bucket. Subclasses add tensor fields (the wire) and may add
    scalar fields that stay local (here ``dtype``, the dtype ``decompress`` gives back)."""

    dtype: torch.dtype

    def tensors(self) -> list[torch.Tensor]:
        """The tensors that go on the wire, in field order."""
        return [v for f in fields(self) if isinstance(v := getattr(self, f.name), torch.Tensor)]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors())


def _checked_decompress(fn):  # type: ignore[no-untyped-def]
    """``decompress`` behind a check that ``numel`` is what the payload was made from: a wrong
    one gave a tensor of the wrong length, an IndexError or a RuntimeError, depending on the
    method; now a GradwireError, as is a payload whose bytes are not what ``wire_bytes``
    says ``numel`` elements take (a numel the output's length cannot show). What it adds per
    call is arithmetic on sizes, no pass over the data."""
    @functools.wraps(fn)
    def decompress(self, payload, numel):  # type: ignore[no-untyped-def]
        if not is_int(numel, 0):
            raise GradwireError(f"{self.name}: numel must be an integer >= 0, got {numel!r}")
        try:
            out = fn(self, payload, numel)
        except (IndexError, RuntimeError, ValueError) as e:
            raise GradwireError(f"{self.name}: cannot decompress this payload to {numel} "
                                f"elements ({type(e).__name__}): was it made from "
                                f"{numel}?") from None
        if isinstance(out, torch.Tensor) and out.numel() != numel:
            raise GradwireError(f"{self.name}: this payload holds {out.numel()} elements, not "
                                f"the {numel} asked for")
        want = self.wire_bytes(numel, payload.dtype)
        if payload.nbytes != want:  # what every compressor sends for numel elements, exactly
            raise GradwireError(f"{self.name}: this payload ({payload.nbytes} bytes) was not "
                                f"made from {numel} elements ({want} bytes)")
        return out
    return decompress


class Compressor(ABC):
    """Base of every compressor: see the module docstring for the contract."""

    name: str
    # What an aggregation method needs to know of its compressor (gradwire.catalogue):
    associative: bool = False  # summed payloads decompress to the sum of what each meant
    error_feedback: bool = False  # biased: what was not sent is kept in a residual
    takes_density: bool = False  # selects a fraction of the elements (density=, warm-up)
    per_rank_seed: bool = False  # stochastic: each rank must draw numbers of its own
    # decompress may give an element the other sign than x's (a low-rank approximation), so
    # x − decompress can pass x's dtype's largest value: error feedback then saturates the
    # residual there (feedback.unapplied); the others' residuals never pass it
    residual_may_overflow: bool = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_int(self.name, "seed", seed, 0)
        self.step = 0

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "decompress" in cls.__dict__:
            cls.decompress = _checked_decompress(cls.__dict__["decompress"])  # type: ignore

    @property
    def params(self) -> dict[str, object]:
        """The parameters a user chose, for tables and ``repr``."""
        return {}

    @abstractmethod
    def compress(self, x: torch.Tensor) -> Payload: ...

    @abstractmethod
    def decompress(self, payload: Payload, numel: int) -> torch.Tensor: ...

    def decompress_into(self, payload: Payload, out: torch.Tensor) -> torch.Tensor:
        """``decompress(payload, out.numel())`` written into ``out`` (of the payload's dtype)
        and returned; a compressor that can write there directly makes no tensor of its own
        (as PyTorch's fp16 hook copies its fp16 sum straight into the bucket)."""
        return out.copy_(self.decompress(payload, out.numel()))

    @abstractmethod
    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int: ...

    def summed_dtype(self, dtype: torch.dtype) -> torch.dtype | None:
        """The dtype an allreduce sums the payload's values in, for a gradient of ``dtype``
        (associative compressors); None where the payload only travels as bytes."""
        return None

    def wire_itemsize(self, dtype: torch.dtype) -> int:
        """Bytes per element of the payload as an allreduce sums it; 1 where the payload only
        travels as bytes."""
        summed = self.summed_dtype(dtype)
        return 1 if summed is None else summed.itemsize

    def combine(self, payloads: list[Payload], numel: int) -> torch.Tensor:
        """The average over ranks of what ``payloads`` (one per rank) stand for: each
        decompressed, times 1/P (as DDP scales before it sums), summed in fp32 (fp64 for
        fp64). Scaled after the sum, P finite values near the dtype's largest (3e38 in fp32
        or bf16) summed to inf where their average is finite."""
        if not payloads:
            raise GradwireError(f"{self.name}: expected at least one payload to combine, got "
                                f"none")
        dtype = payloads[0].dtype
        total = torch.zeros(numel, dtype=acc_dtype(dtype), device=payloads[0].tensors()[0].device)
        share = 1 / len(payloads)
        for p in payloads:
            total.add_(self.decompress(p, numel), alpha=share)
        return total.to(dtype)

    def forget(self, used: set) -> None:
        """Drop what is kept per bucket from step to step (warm starts, scratch) for the
        buckets not in ``used``: those a rebuild of DDP's buckets retired. Most compressors
        keep nothing per bucket."""
        return None

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.step = int(state["step"])  # type: ignore[arg-type]

    def _generator(self, device: torch.device) -> torch.Generator:
        """A generator for this call, seeded from (seed, step); advances the step."""
        g = generator(self.seed, self.step, device)
        self.step += 1
        return g

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


def check_input(name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` checked as a compressor's input, detached: a gradient that requires grad itself
    (under ``create_graph``) is compressed as its values, as DDP's hooks see it."""
    if not isinstance(x, torch.Tensor):
        raise GradwireError(f"{name}: expected a 1-D float tensor (fp16, bf16, fp32, fp64), got "
                            f"{type(x).__name__}")
    if x.dim() != 1 or x.dtype not in FLOATS:
        raise GradwireError(f"{name}: expected a 1-D float tensor (fp16, bf16, fp32, fp64), got "
                            f"shape {tuple(x.shape)} {x.dtype}")
    return x.detach()


P = TypeVar("P", bound=Payload)


def expect(name: str, payload: Payload, cls: type[P]) -> P:
    """``payload`` as a ``cls``; a payload of another compressor is a user error."""
    if not isinstance(payload, cls):
        raise GradwireError(f"{name}: expected a {cls.__name__} to decompress, got "
                            f"{type(payload).__name__}")
    return payload


def select_count(numel: int, density: float | None, k: int | None) -> int:
    """Elements to keep: ``k`` if given, else max(1, ceil(density·numel)); never above numel."""
    if numel == 0:
        return 0
    if k is not None:
        return min(k, numel)
    assert density is not None
    # round() first: 0.01 * 700 is 7.000000000000001 in floating point, and should select 7.
    return min(numel, max(1, math.ceil(round(density * numel, 6))))


def generator(seed: int, step: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from (seed, step): the same pair gives the same stream on every rank."""
    g = torch.Generator(device=device)
    # int(): a numpy integer (which the parameter checks accept) overflowed int64 in the
    # product and raised OverflowError at the first compress
    g.manual_seed((int(seed) * 0x9E3779B97F4A7C15 + int(step) * 0xBF58476D1CE4E5B9) % 2**63)
    return g
