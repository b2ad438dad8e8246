"""Model profiles: what the performance model needs to know about a network.

A profile is a plain JSON file (``profiles/*.json`` are the built-in ones; a user may write
their own and pass its path wherever a model name is accepted). Fields:

- ``format``: 1, the version of this layout.
- ``model`` (text): the name shown in tables; ``description`` (text): one line, architecture
  and reference implementation.
- ``params``: ``[[name, elements], ...]``, every parameter tensor **in backward order** (the
  order their gradients become ready: the reverse of registration order). A row may add the
  tensor's shape, ``[name, elements, [d0, d1, ...]]`` (dims >= 1 whose product is elements;
  ``[]`` for a 0-d tensor); PowerSGD's cost needs it. Rows with and without shapes may mix.
- ``forward_s``, ``backward_s``: seconds for one mini-batch, or null; ``step_s``: the optimizer
  step (default 0). Every time is at most 1e6 s, and the parameters hold at most 2**50 bytes
  (``gradwire.check``'s bounds, a trace's too), so that the model's sums stay finite.
- ``backward_layer_s`` (optional): backward compute of each tensor of ``params`` (same length,
  summing to ``backward_s`` within 0.1 %; with ``backward_s`` null, their sum is backward's);
  without it, backward time is spread in proportion to elements.
- ``batch_size``: the per-worker mini-batch the times are for, or null.
- ``dtype``: "float32" (default), "float16" or "bfloat16", the gradient's element type.
- ``sources``: ``{field: text}``, where each number comes from (paper and table, or "measured
  here by gradwire profile: ...").

null compute times mean no source gives them: the model refuses to predict until a user
supplies them (``--compute-ms``) or measures the project's model with ``gradwire profile``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from gradwire.check import MAX_BYTES, MAX_SECONDS, is_int, is_real, parse_numbers
from gradwire.errors import GradwireError, did_you_mean
from gradwire.jsonfile import parse_object, read_text, shown

FORMAT = 1
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
BUILTIN_DIR = "builtin"
# How far backward_layer_s may sum from backward_s (rounding in a hand-written file); gradwire
# profile splits backward_s itself, so its sums are equal up to floating point.
LAYER_SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Profile:
    model: str
    params: tuple[tuple[str, int], ...]  # backward order
    forward_s: float | None
    backward_s: float | None
    step_s: float = 0.0
    backward_layer_s: tuple[float, ...] | None = None
    batch_size: int | None = None
    dtype: str = "float32"
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    # The shape of each tensor of params (None where unknown); None when no shape is known.
    shapes: tuple[tuple[int, ...] | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.shapes is None:
            return
        if len(self.shapes) != len(self.params):
            raise ValueError(f"Profile {self.model!r}: {len(self.shapes)} shapes for "
                             f"{len(self.params)} tensors")
        shapes = tuple(None if s is None else tuple(s) for s in self.shapes)
        object.__setattr__(self, "shapes",
                           None if all(s is None for s in shapes) else shapes)

    @property
    def numel(self) -> int:
        return sum(n for _, n in self.params)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def has_compute(self) -> bool:
        return self.forward_s is not None and self.backward_s is not None

    def layer_backward_s(self) -> list[float]:
        """Backward compute of each tensor (backward order): measured, or ∝ elements."""
        if self.backward_layer_s is not None:
            return list(self.backward_layer_s)
        total = self.numel or 1
        return [(self.backward_s or 0.0) * n / total for _, n in self.params]

    def with_compute(self, forward_s: float, backward_s: float, source: str) -> Profile:
        """This profile with other compute times (per-tensor split kept in proportion)."""
        layers = None
        if self.backward_layer_s is not None and self.backward_s:
            layers = tuple(t * backward_s / self.backward_s for t in self.backward_layer_s)
        return Profile(self.model, self.params, forward_s, backward_s, self.step_s, layers,
                       self.batch_size, self.dtype, self.description,
                       {**self.sources, "forward_s": source, "backward_s": source},
                       self.shapes)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "format": FORMAT, "model": self.model, "description": self.description,
            "batch_size": self.batch_size, "dtype": self.dtype, "forward_s": self.forward_s,
            "backward_s": self.backward_s, "step_s": self.step_s, "sources": self.sources}
        if self.backward_layer_s is not None:
            doc["backward_layer_s"] = list(self.backward_layer_s)
        shapes = self.shapes or (None,) * len(self.params)
        doc["params"] = [[name, n] if s is None else [name, n, list(s)]
                         for (name, n), s in zip(self.params, shapes, strict=True)]
        return doc

    def to_text(self) -> str:
        """The JSON file: header fields indented, then one parameter tensor per line."""
        doc = self.to_json()
        params = doc.pop("params")
        # allow_nan=False: a time that is not finite fails here rather than write a file that
        # no strict JSON reader takes
        head = json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)[:-2]
        rows = ",\n".join("  " + json.dumps(p, allow_nan=False)  # type: ignore[union-attr]
                           for p in params)
        return f'{head},\n "params": [\n{rows}\n ]\n}}\n'


def with_compute_ms(prof: Profile, text: str) -> Profile:
    """``prof`` with the compute times of ``--compute-ms FORWARD,BACKWARD`` (ms, each > 0
    and at most MAX_SECONDS), for a profile that has none or other ones to try."""
    times = parse_numbers("--compute-ms", text)
    if len(times) != 2:
        raise GradwireError(f"--compute-ms {text!r}: expected FORWARD,BACKWARD in ms")
    if max(times) > MAX_SECONDS * 1e3:  # a profile's times go up to MAX_SECONDS
        raise GradwireError(f"--compute-ms {text!r}: each time must be at most "
                            f"{MAX_SECONDS * 1e3:g} ms, got {max(times):g}")
    return prof.with_compute(times[0] / 1e3, times[1] / 1e3, "--compute-ms")


def builtin_names() -> list[str]:
    root = resources.files("gradwire.profiles").joinpath(BUILTIN_DIR)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load(name_or_path: str) -> Profile:
    """The built-in profile ``name_or_path``, or the profile file at that path."""
    path = Path(name_or_path)
    try:  # a name too long to be a path, a loop of links: no file is there
        exists, is_file = path.exists(), path.is_file()
    except OSError:
        exists = is_file = False
    # a directory is never a profile: one named as a built-in profile (a run's output folder
    # "resnet50" in the working directory) leaves that name to the built-in one
    shadowed = exists and not is_file and path.suffix != ".json" and name_or_path in builtin_names()
    if (path.suffix == ".json" or exists) and not shadowed:
        if not is_file:
            why = "is not a regular file" if exists else "not found"
            raise GradwireError(f"profile file {name_or_path!r} {why}")
        return parse(read_text(path, str(path)), str(path))
    names = builtin_names()
    if name_or_path not in names:
        from gradwire.models import MODELS

        if name_or_path in MODELS:  # a model gradwire trains, but has no built-in profile of
            raise GradwireError(
                f"no built-in profile of {name_or_path!r}: measure one on the machine it will "
                f"train on with `gradwire profile --model {name_or_path} --out "
                f"{name_or_path}.json` and pass that file (built-in: {', '.join(names)})")
        raise GradwireError(f"unknown profile {name_or_path!r}{did_you_mean(name_or_path, names)}"
                            f": expected one of {', '.join(names)} or a .json file")
    text = resources.files("gradwire.profiles").joinpath(BUILTIN_DIR, f"{name_or_path}.json")
    # UTF-8 whatever the locale, as read_text reads a user's file (a description holds "§")
    return parse(text.read_text(encoding="utf-8"), f"built-in profile {name_or_path}")


# The first line of a compute trace (gradwire.sim.trace, which this layer does not import):
# a file of one is said to be a trace, not read as a profile that is not valid JSON.
TRACE_FORMAT = "gradwire-trace"


def _first_line_format(text: str) -> object:
    """The "format" of the JSON object on ``text``'s first line (None where there is none)."""
    try:  # read as every JSON file is: nesting too deep is an error, not a RecursionError
        return parse_object(text.lstrip("\ufeff").split("\n", 1)[0], "").get("format")
    except GradwireError:
        return None


def parse(text: str, where: str) -> Profile:
    """A Profile from JSON ``text``; every defect is a one-line error naming the field."""
    try:
        doc = parse_object(text, where)
    except GradwireError:
        if _first_line_format(text) == TRACE_FORMAT:
            raise GradwireError(f"{shown(where)} is a compute trace (`gradwire trace`), not a "
                                "model profile: simulate takes it as --trace FILE; a profile "
                                "is measured with `gradwire profile --model M --out FILE`"
                                ) from None
        raise
    known = ("format", "model", "description", "params", "forward_s", "backward_s", "step_s",
             "backward_layer_s", "batch_size", "dtype", "sources")
    for key in doc:
        if key not in known:
            raise GradwireError(f"{where}: unknown field {key!r}{did_you_mean(key, known)}")
    # an integer: JSON's true (== 1 in Python) or 1.0 is no version of this layout
    if not is_int(doc.get("format")) or doc.get("format") != FORMAT:
        raise GradwireError(f"{where}: field 'format' must be {FORMAT}, got "
                            f"{doc.get('format')!r}")

    def bad(name: str, expected: str, got: object) -> GradwireError:
        return GradwireError(f"{where}: field {name!r} must be {expected}, got {got!r}")

    def seconds(name: str, optional: bool) -> float | None:
        v = doc.get(name)
        if v is None and optional:
            return None
        if not is_real(v, 0):
            raise bad(name, "a finite number of seconds >= 0" + (" or null" if optional else ""),
                      v)
        if v > MAX_SECONDS:
            raise bad(name, f"at most {MAX_SECONDS:g} seconds", v)
        return float(v)

    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "a non-empty string", model)
    params = doc.get("params")
    if not isinstance(params, list) or not params:
        raise bad("params", "a non-empty list of [name, elements]", params)
    tensors = []
    shapes: list[tuple[int, ...] | None] = []
    for i, p in enumerate(params):
        if (not isinstance(p, list) or len(p) not in (2, 3) or not isinstance(p[0], str)
                or not is_int(p[1], 1)):
            raise bad(f"params[{i}]", "[name, elements >= 1] or [name, elements, shape]", p)
        tensors.append((p[0], p[1]))
        shapes.append(None if len(p) == 2 else _shape(p[2], p[1], f"{where}: params[{i}]"))
    forward_s, backward_s = seconds("forward_s", True), seconds("backward_s", True)
    step_s = seconds("step_s", False) if "step_s" in doc else 0.0
    layers = doc.get("backward_layer_s")
    if layers is not None:
        if (not isinstance(layers, list) or len(layers) != len(tensors)
                or not all(is_real(t, 0, MAX_SECONDS) for t in layers)):
            raise bad("backward_layer_s", f"a list of {len(tensors)} finite numbers >= 0 and "
                      f"<= {MAX_SECONDS:g} (one per tensor of params)",
                      layers if not isinstance(layers, list)
                      else f"{len(layers)} entries")
        layers = tuple(float(t) for t in layers)
        total = math.fsum(layers)
        if backward_s is None:
            if total > MAX_SECONDS:  # backward_s is this sum: bounded as a given one is
                raise bad("backward_layer_s", f"a list summing to at most {MAX_SECONDS:g} "
                          "seconds (backward_s is null: the sum is backward's)", f"{total:g} s")
            backward_s = total
        elif not math.isclose(total, backward_s, rel_tol=LAYER_SUM_TOLERANCE, abs_tol=1e-9):
            # the buckets' ready times come from the layers and backward's end from
            # backward_s: far apart, the model would price a backward that never ran
            raise GradwireError(f"{where}: field 'backward_layer_s' must sum to backward_s "
                                f"({backward_s:g} s) within {LAYER_SUM_TOLERANCE:.1%}, got "
                                f"{total:g} s")
    batch = doc.get("batch_size")
    if batch is not None and not is_int(batch, 1):
        raise bad("batch_size", "an integer >= 1 or null", batch)
    dtype = doc.get("dtype", "float32")
    if not isinstance(dtype, str) or dtype not in DTYPES:  # a list or object is no key of DTYPES
        raise bad("dtype", f"one of {', '.join(DTYPES)}", dtype)
    total = sum(n for _, n in tensors) * DTYPES[dtype]
    if total > MAX_BYTES:
        raise GradwireError(f"{where}: field 'params' must hold at most 2**50 bytes in all, got "
                            f"{total} bytes of {dtype}")
    description = doc.get("description")
    description = "" if description is None else description
    if not isinstance(description, str):  # one line of text: the tables print it as it is
        raise bad("description", "a string or null", description)
    sources = doc.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise bad("sources", "an object of text", sources)
    return Profile(model, tuple(tensors), forward_s, backward_s, step_s or 0.0, layers, batch,
                   dtype, description, dict(sources), tuple(shapes))


def _shape(shape: object, elements: int, where: str) -> tuple[int, ...]:
    """The shape of one row of params, checked against its element count."""
    if not isinstance(shape, list) or not all(is_int(d, 1) for d in shape):
        raise GradwireError(f"{where}: shape must be a list of integers >= 1 ([] for a 0-d "
                            f"tensor), got {shape!r}")
    if math.prod(shape) != elements:
        raise GradwireError(f"{where}: shape {shape!r} has {math.prod(shape)} elements, the row "
                            f"says {elements}")
    return tuple(shape)
