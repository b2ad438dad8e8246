"""A calibration file: what ``gradwire calibrate`` measured on the ranks' own devices and
network, for the performance model. JSON, one object; times in seconds, sizes in bytes. Every
α is at most 1 s and γ at most 1 µs per byte, the bounds of ``--alpha-us`` and ``--gamma-ns``.

Network (every call on the run's backend, gloo or NCCL, with tensors on the ranks' device):

- ``format``: 2, the version of this layout.
- ``alpha_s``: α, latency per step of a ring. The backend's own allreduce of a P-element fp32
  tensor, every rank taking part (as the compression-utility paper measures it): 5 runs of
  40 calls after 20, the median run's time per call, the median over ranks, divided by a
  ring allreduce's 2(P−1) steps. ``alpha_call_s``: that time per call itself.
- ``alpha_transport_s``: α of gradwire's own executor (point-to-point sends and receives over
  the backend, as the sparse methods' schedules and the call headers run): its ring
  allreduce of P fp32 elements, timed the same way, per step; null in files without it
  (then ``alpha_s``).
- ``beta_s_per_byte``: β, seconds per byte between two ranks: rank 0 sends a window of 16
  messages of 4 MiB (isend/irecv), the peer answers with 4 bytes (osu_bw); β = time / bytes,
  the median of 3 windows after one. The peer is the first rank of another node (rank
  ``ranks_per_node``), or rank 1 when there is one node; ``beta_between`` says which:
  ``"nodes"`` or ``"ranks of one node"``.
- ``beta_intra_s_per_byte``: the same between ranks 0 and 1 where they share a node and
  there are several nodes; else null.

Device (rank 0's, the other ranks waiting, unless said otherwise):

- ``gamma_s_per_byte``: γ, reduction: ``a.add_(b)`` over 64 MiB of fp32, per byte of ``b``,
  the median of 5.
- ``reduce``: γ of the half-precision reductions, from the backend's own allreduce of the
  same ``nbytes`` per rank as fp32, fp16 and bf16 (twice the elements), every rank at once,
  interleaved, the median over ranks of the median of 5 (``float32_s``, ``float16_s``,
  ``bfloat16_s``): a dtype's γ per byte is γ plus its extra time over the bytes a rank
  reduces in the ring, (P − 1)/P · ``nbytes`` (:meth:`Calibration.gamma_dtype`). Null in
  files without it: every dtype reduces at γ.
- ``codecs``: every aggregation method's encode and decode on the device, a codec table as
  :mod:`gradwire.perf.codecs` reads it (``numel``, ``dtype``, ``source``, ``methods``: per
  method ``params``, ``encode_s``, ``decode_s``, ``decode_fixed_s`` for the vote,
  ``decode_rank_s`` for Top-k's sum, ``merge_s`` for gTop-k's ⊤). Each method's compressor
  (the sparse aggregations: their hook's plans, every rank's in one process), never its
  communication, on one DDP bucket of random fp32 (25 MiB, or the whole ``model`` where it is
  smaller), the median of a few, each call after a write over twice the device's last-level
  cache (a hook finds its bucket in memory).
- ``overlap_slowdown``: κ (from 1 to 100, as ``--overlap-slowdown``), how much longer
  backward takes while a large allreduce runs beside it, every rank at once; ``overlap``:
  ``model`` (the stand-in model that ran backward), ``backward_s`` (alone),
  ``with_comm_s`` (beside the allreduce), ``comm_bytes`` (the allreduce's size), each the
  median over ranks of the median of 5.
- ``coding_slowdown``: t / (b + e): backward (b) and a Top-k encode of one bucket (e) run at
  the same time (a second thread, on CUDA a second stream) take t; above 1, overlapping
  them is slower than running them in turn (compression-utility paper, §3.1); at most 100,
  as κ. ``coding``: ``method``, ``numel``, ``backward_s``, ``encode_s``, ``together_s``,
  medians of 5.
- ``compute_slowdown``: how much longer a rank computes in training than its profile says
  (from 1 to 10⁶, as ``cpu_slowdown``): a stand-in MLP with the profile's parameter count,
  its batch sized so that its backward takes the profile's, timed forward, backward and SGD
  step on rank 0 alone, bare (as ``gradwire profile`` times a model), then on every rank at
  once under DDP with a comm hook that sends nothing. ``compute``: ``model``, ``alone_s``,
  ``together_s`` (medians; the second the median over ranks). 1 in files without it.
- ``cpu``: on CPU ranks, how they share the machine's cores (null on CUDA):
  ``cpu_ranks_per_machine``, ``cores_per_machine``, ``cpu_step_s`` (CPU per schedule step),
  ``cpu_call_s`` (CPU per call of the backend's own collectives, its steps included; 0 in
  files without it), ``cpu_byte_s`` (CPU per byte moved), ``cpu_share`` (share of the cores
  the ranks keep busy), ``cpu_sync_s`` and ``cpu_sync_step_s`` (wait per collective call, per
  step), ``cpu_slowdown`` (memory-bound work from memory, every rank running / alone; at
  most 10⁶); see :mod:`gradwire.bench.sharing`.

Where and how:

- ``world``, ``ranks_per_node`` (LOCAL_WORLD_SIZE), ``nodes``; ``backend`` (gloo or nccl);
  ``device`` ("cpu" or the GPU's name); ``model`` (the profile whose bucket the codecs
  were timed on).
- ``network``, ``bandwidth``: the emulated cluster's label and link rate (null elsewhere);
  ``burst_bytes``: its links' token bucket (0 where links are not shaped).
- ``gradwire``, ``commit``, ``machine``, ``command``, ``date``: who measured it, where and when.

Example::

    from gradwire.perf import calibration
    cal = calibration.load("cal.json")
    cal.alpha_s, cal.beta_s_per_byte, cal.codecs.seconds("topk", 6_553_600, cal.world)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from gradwire.check import (
    MAX_ALPHA_US,
    MAX_BYTES,
    MAX_GAMMA_NS,
    MAX_OVERLAP_SLOWDOWN,
    MAX_SECONDS,
    SPEEDUP_RANGE,
    is_int,
    is_real,
)
from gradwire.errors import GradwireError, did_you_mean
from gradwire.jsonfile import dumps, read_object, replace_text, shown
from gradwire.perf.codecs import CodecTable, check_table

FORMAT = 2
BETWEEN = ("nodes", "ranks of one node")
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Overlap:
    """κ's raw times: the stand-in ``model``'s backward alone and beside an allreduce of
    ``comm_bytes``."""

    model: str
    backward_s: float
    with_comm_s: float
    comm_bytes: int


@dataclass(frozen=True)
class Coding:
    """The coding slowdown's raw times: backward, ``method``'s encode of ``numel`` elements,
    and both at once."""

    method: str
    numel: int
    backward_s: float
    encode_s: float
    together_s: float


@dataclass(frozen=True)
class Compute:
    """The compute slowdown's raw times: the stand-in ``model``'s iteration on one rank
    alone, bare, and on every rank at once under DDP."""

    model: str
    alone_s: float
    together_s: float


@dataclass(frozen=True)
class CpuTerms:
    """How CPU ranks share their machine's cores (:mod:`gradwire.bench.sharing`); the names
    are the file's."""

    cpu_ranks_per_machine: int
    cores_per_machine: int
    cpu_step_s: float
    cpu_byte_s: float
    cpu_share: float
    cpu_sync_s: float
    cpu_sync_step_s: float
    cpu_slowdown: float
    cpu_call_s: float = 0.0


@dataclass(frozen=True)
class Reduce:
    """The half-precision reductions' raw times: the backend's allreduce of ``nbytes`` per
    rank as each dtype."""

    nbytes: int
    float32_s: float
    float16_s: float
    bfloat16_s: float


@dataclass(frozen=True)
class Calibration:
    """One calibration file's fields (the module docstring says what each is)."""

    alpha_s: float
    alpha_call_s: float
    beta_s_per_byte: float
    beta_between: str
    beta_intra_s_per_byte: float | None
    gamma_s_per_byte: float
    overlap_slowdown: float
    overlap: Overlap
    coding_slowdown: float
    coding: Coding
    codecs: CodecTable
    cpu: CpuTerms | None
    world: int
    ranks_per_node: int
    nodes: int
    backend: str
    device: str
    model: str
    gradwire: str
    commit: str
    machine: str
    command: str
    date: str
    network: str | None = None
    bandwidth: str | None = None
    burst_bytes: float = 0.0
    alpha_transport_s: float | None = None
    compute_slowdown: float = 1.0
    compute: Compute | None = None
    reduce: Reduce | None = None

    def gamma_dtype(self) -> dict[str, float]:
        """γ per byte reduced of each half-precision dtype measured (none without
        ``reduce``): γ plus its time over fp32's on the same bytes, per byte a rank reduces
        in the ring; never below γ."""
        if self.reduce is None:
            return {}
        r, reduced = self.reduce, self.reduce.nbytes * (self.world - 1) / self.world
        return {name: self.gamma_s_per_byte + max(t - r.float32_s, 0.0) / reduced
                for name, t in (("float16", r.float16_s), ("bfloat16", r.bfloat16_s))}

    def to_json(self) -> dict:
        d = {"format": FORMAT}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, CodecTable):
                v = {"numel": v.numel, "dtype": "float32", "source": v.source,
                     "methods": v.methods}
            elif dataclasses.is_dataclass(v):
                v = dataclasses.asdict(v)
            d[f.name] = v
        return d

    def dumps(self) -> str:
        return dumps(self.to_json(), indent=1) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the calibration to ``path``, replaced whole (:func:`replace_text`): a save that
        fails half way leaves the calibration that was there, which bench and advise read."""
        replace_text(path, self.dumps())


def load(path: str | Path) -> Calibration:
    """The calibration in the file at ``path``; every defect is a one-line error naming the
    file and the field."""
    where = f"calibration file {shown(str(path))}"
    return parse(read_object(path, where), where)


def parse(doc: dict, where: str) -> Calibration:
    """A :class:`Calibration` from a file's JSON object; ``where`` names it in errors."""
    # the slowdowns multiply the profile's times: κ and the coding slowdown at most what
    # --overlap-slowdown takes, the compute and CPU slowdowns at most the inverse of the
    # smallest compute speed-up, so that the model's sums stay finite
    most = MAX_OVERLAP_SLOWDOWN
    most_alpha = MAX_ALPHA_US * 1e-6  # α and γ as --alpha-us and --gamma-ns take them
    if "format" not in doc:
        raise GradwireError(f"{where} was written by an older gradwire calibrate (it has no "
                            "'format' field): run `gradwire calibrate` again")
    if doc["format"] != FORMAT:
        raise GradwireError(f"{where}: field 'format' must be {FORMAT}, got "
                            f"{doc['format']!r}: run `gradwire calibrate` again")
    r = _Reader(doc, where).only(("format", *_names(Calibration)))
    # a call is a ring's 2(P−1) steps of α each (P: the world, checked below where it is read)
    steps = 2 * (doc["world"] - 1) if is_int(doc.get("world"), 2) else 1
    cal = Calibration(
        alpha_s=r.seconds("alpha_s", above=True, high=most_alpha),
        alpha_call_s=r.seconds("alpha_call_s", above=True, high=most_alpha * steps),
        beta_s_per_byte=r.seconds("beta_s_per_byte", above=True),
        beta_between=r.choice("beta_between", BETWEEN),
        beta_intra_s_per_byte=r.seconds("beta_intra_s_per_byte", above=True, null=True),
        gamma_s_per_byte=r.seconds("gamma_s_per_byte", above=True, high=MAX_GAMMA_NS * 1e-9),
        overlap_slowdown=r.factor("overlap_slowdown", 1.0, most),
        overlap=_overlap(r.sub("overlap")),
        coding_slowdown=r.factor("coding_slowdown", 0.0, most, above=True),
        coding=_coding(r.sub("coding")),
        codecs=_codecs(r.sub("codecs"), where),
        cpu=_cpu_terms(r, doc),
        world=r.integer("world", 2),
        ranks_per_node=r.integer("ranks_per_node", 1),
        nodes=r.integer("nodes", 1),
        backend=r.choice("backend", BACKENDS),
        device=r.text("device"),
        model=r.text("model"),
        gradwire=r.text("gradwire"),
        commit=r.text("commit"),
        machine=r.text("machine"),
        command=r.text("command"),
        date=r.text("date"),
        network=r.text("network", null=True),
        bandwidth=r.text("bandwidth", null=True),
        burst_bytes=r.number("burst_bytes", "a number of bytes >= 0", 0.0, default=0.0),
        alpha_transport_s=(r.seconds("alpha_transport_s", above=True, high=most_alpha)
                           if doc.get("alpha_transport_s") is not None else None),
        compute_slowdown=r.factor("compute_slowdown", 1.0, SPEEDUP_RANGE[1], default=1.0),
        compute=None if doc.get("compute") is None else _compute(r.sub("compute")),
        reduce=None if doc.get("reduce") is None else _reduce(r.sub("reduce")),
    )
    _check_layout(cal, where)
    for name, g in cal.gamma_dtype().items():  # bounded as gamma_s_per_byte is
        if not g <= MAX_GAMMA_NS * 1e-9:
            raise GradwireError(f"{where}: field 'reduce.{name}_s' makes the {name} γ "
                                f"{g * 1e9:.4g} ns per byte, expected at most {MAX_GAMMA_NS:g}")
    return cal


def _check_layout(cal: Calibration, where: str) -> None:
    """World, nodes and the link β was measured over agree, as calibrate writes them."""
    w, per, n = cal.world, cal.ranks_per_node, cal.nodes
    if per > w:
        raise GradwireError(f"{where}: field 'ranks_per_node' is {per}, more than the "
                            f"{w} ranks of 'world'")
    if n != -(-w // per):
        raise GradwireError(f"{where}: field 'nodes' is {n}, but {w} ranks at {per} a node "
                            f"are {-(-w // per)} nodes")
    between = BETWEEN[0] if n > 1 else BETWEEN[1]
    if cal.beta_between != between:
        raise GradwireError(f"{where}: field 'beta_between' is {cal.beta_between!r}, but with "
                            f"{n} node(s) calibrate measures β between {between}")


def _cpu_terms(r: _Reader, doc: dict) -> CpuTerms | None:
    """The ``cpu`` field: null on CUDA; left out, the CPU bound would go unpriced unsaid."""
    if "cpu" not in doc:
        raise r.bad("cpu", "an object or null")
    return None if doc["cpu"] is None else _cpu(r.sub("cpu"))


class _Reader:
    """Checked fields of one JSON object; errors name the file and the field's dotted path."""

    def __init__(self, doc: dict, where: str, prefix: str = "") -> None:
        self.doc, self.where, self.prefix = doc, where, prefix

    def bad(self, key: str, expected: str) -> GradwireError:
        if key not in self.doc:
            return GradwireError(f"{self.where}: field {self.prefix + key!r} is missing "
                                 f"(expected {expected}): run `gradwire calibrate` again")
        got = shown(repr(self.doc[key]))
        got = got if len(got) <= 60 else got[:57] + "..."
        return GradwireError(f"{self.where}: field {self.prefix + key!r} must be {expected}, "
                             f"got {got}")

    def number(self, key: str, expected: str, low: float, *, above: bool = False,
               high: float = math.inf, null: bool = False,
               default: float | None = None) -> float | None:
        v = self.doc.get(key, default)
        if v is None and null and key in self.doc:
            return None
        if not is_real(v, low, high, above=above):
            raise self.bad(key, expected + (" or null" if null else ""))
        return float(v)

    def seconds(self, key: str, *, above: bool = False, null: bool = False,
                high: float = MAX_SECONDS) -> float | None:
        # at most MAX_SECONDS, as a profile's and a trace's times, so the model's sums stay
        # finite, or the bound of the option that gives the same term
        return self.bounded(key, 0.0, high, "a number of seconds", above=above, null=null)

    def factor(self, key: str, low: float, high: float, *, above: bool = False,
               default: float | None = None) -> float:
        """A slowdown from ``low`` to ``high``."""
        return self.bounded(key, low, high, "a number", above=above,  # type: ignore[return-value]
                            default=default)

    def bounded(self, key: str, low: float, high: float, what: str, *, above: bool = False,
                null: bool = False, default: float | None = None) -> float | None:
        """:meth:`number` from ``low`` to ``high``, the upper bound named in the error only
        where it is the one the value breaks."""
        over = is_real(self.doc.get(key, default), high, above=True)
        return self.number(key, f"{what} {'>' if above else '>='} {low:g}"
                           + (f" and <= {high:g}" if over else ""), low, above=above,
                           high=high, null=null, default=default)

    def integer(self, key: str, low: int) -> int:
        # counts (bytes, elements, ranks, cores) up to MAX_BYTES, which a float holds exactly
        v = self.doc.get(key)
        if not is_int(v, low, MAX_BYTES):
            over = is_int(v, MAX_BYTES + 1)
            raise self.bad(key, f"an integer >= {low}"
                           + (f" and <= {MAX_BYTES} (2**50)" if over else ""))
        return int(v)

    def text(self, key: str, *, null: bool = False) -> str | None:
        v = self.doc.get(key)
        if v is None and null and key in self.doc:
            return None
        if not isinstance(v, str):
            raise self.bad(key, "text" + (" or null" if null else ""))
        return v

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        v = self.doc.get(key)
        if v not in allowed:
            raise self.bad(key, "one of " + ", ".join(repr(a) for a in allowed))
        return v

    def sub(self, key: str) -> _Reader:
        v = self.doc.get(key)
        if not isinstance(v, dict):
            raise self.bad(key, "an object")
        return _Reader(v, self.where, f"{self.prefix}{key}.")

    def only(self, known: tuple[str, ...]) -> _Reader:
        """This object if it has no field but ``known`` (a misspelt optional one would be left
        out unsaid)."""
        for key in self.doc:
            if key not in known:
                raise GradwireError(f"{self.where}: unknown field "
                                    f"{shown(self.prefix + str(key))!r}"
                                    f"{did_you_mean(str(key), known)}")
        return self


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _overlap(r: _Reader) -> Overlap:
    r.only(_names(Overlap))
    return Overlap(r.text("model"), r.seconds("backward_s", above=True),
                   r.seconds("with_comm_s", above=True), r.integer("comm_bytes", 1))


def _coding(r: _Reader) -> Coding:
    r.only(_names(Coding))
    return Coding(r.text("method"), r.integer("numel", 1), r.seconds("backward_s", above=True),
                  r.seconds("encode_s", above=True), r.seconds("together_s", above=True))


def _compute(r: _Reader) -> Compute:
    r.only(_names(Compute))
    return Compute(r.text("model"), r.seconds("alone_s", above=True),
                   r.seconds("together_s", above=True))


def _reduce(r: _Reader) -> Reduce:
    r.only(_names(Reduce))
    return Reduce(r.integer("nbytes", 1), *(r.seconds(f"{d}_s", above=True)
                                           for d in ("float32", "float16", "bfloat16")))


def _cpu(r: _Reader) -> CpuTerms:
    r.only(_names(CpuTerms))
    return CpuTerms(
        r.integer("cpu_ranks_per_machine", 1), r.integer("cores_per_machine", 1),
        r.seconds("cpu_step_s"), r.seconds("cpu_byte_s"),
        r.number("cpu_share", "a number > 0 and <= 1", 0.0, above=True, high=1.0),
        r.seconds("cpu_sync_s"), r.seconds("cpu_sync_step_s"),
        r.factor("cpu_slowdown", 1.0, SPEEDUP_RANGE[1]),
        r.seconds("cpu_call_s") if "cpu_call_s" in r.doc else 0.0)


def _codecs(r: _Reader, where: str) -> CodecTable:
    r.only(("numel", "dtype", "source", "methods"))
    methods = r.sub("methods")
    source = check_table(r.doc, where, r.prefix)
    return CodecTable(where, r.integer("numel", 1), dict(methods.doc), source)
