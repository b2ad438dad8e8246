"""Predicted iteration time of data-parallel training: compute overlapped with bucketed,
scheduled communication (the compression-utility paper's model, §4, with every collective
costed from its schedule).

For a profile (tensors in backward order, compute times), a cluster (P, α, β, γ) and an
aggregation (a method of :data:`gradwire.hooks.METHODS` and its parameters):

1. Buckets as DDP forms them: tensors in backward order, the first bucket closed at
   ``first_bucket_mb`` and the others at ``bucket_mb`` (DDP's first bucket: 1 MiB under its
   default cap of 25, the cap under any other; mode "model": one bucket of everything).
   Bucket b is ready when backward has produced its last tensor:
   R_b = κ·Σ backward time of the tensors up to it, κ ≥ 1 the slowdown of compute that runs
   beside communication (only when there is something to overlap: more than one bucket).
2. One FIFO communication thread (as the hooks run): E_b = max(R_b, E_{b−1}) + encode_b +
   comm_b + decode_b. The last bucket can only start after backward: the exposed tail.
3. comm_b is ``cost()`` of the schedules of the calls the catalogue's plan of the method
   makes for the bucket (:mod:`gradwire.catalogue`, :mod:`.comm`), after the call header's
   exchange (``ClusterModel.check_calls``; as the hooks in steady state without a density
   warm-up: one before every bucket for methods that agree on a NaN/Inf status first, none
   for the others): dense,
   fp16/bf16, random-k: ring allreduce (gloo's); PowerSGD: two ring allreduces (P and Q); top-k and
   gTop-k: their sparse schedules; int8: one ring allreduce of int8 levels; every other
   method: ring allgather of the payloads.
   encode/decode from a codec table (:mod:`.codecs`).
4. t_iter = t_f + max(κ·t_b, E_last) + t_step; scaling efficiency e = (t_f + t_b)/t_iter
   (Eq. 4 of the gTop-k paper with t_c the communication and coding backward did not hide).
5. Shared CPU (``ClusterModel.cores`` set): when n ranks share a machine of C cores, an iteration
   takes at least L·D/u + S·s, L = max(1, n/C). D is the CPU one rank spends per
   iteration: its compute (t_f + t_b + t_step), encode and decode (times ``cpu_slowdown``:
   memory-bound work takes longer beside the other ranks), and its part of every schedule
   (:func:`gradwire.perf.comm.cpu_seconds`: ``cpu_step`` per step it takes part in,
   ``cpu_byte`` per byte it moves, γ per byte it reduces; a call of the backend's own
   collectives ``cpu_call`` instead of its steps, where calibrated: its threads wake for
   every call, where gradwire's executor runs its steps in the rank's thread).
   u (``cpu_share``) is the share of the cores the ranks keep busy, S the schedule steps a
   rank takes part in per iteration (headers included) and s (``cpu_sync``) what each step
   waits, its cores idle, for a peer the scheduler has not run yet. ``gradwire calibrate``
   measures u and s by alternating bursts of compute with allreduces (s per call of its
   recursive-doubling probe, divided by that probe's steps). The wait is charged per step,
   not per call: the time left unexplained grew with the schedule steps a method takes
   (PowerSGD's two ring allreduces a bucket take 4(P − 1)), not with its calls.
   The same ranks in the timeline (points 2-4): the communication thread's encode and
   decode run on every rank at once (the ranks leave a collective together), so each takes
   L·``cpu_slowdown``/u times its one-rank time there. Compute in the timeline is the
   profile's. The emulated cluster is such a
   machine: every rank on its 2 cores, so compressed runs, whose wire time is small, are
   bound by CPU there.
6. Stragglers (``ClusterModel.straggle``, default 0): ranks do not finish their compute together
   (iteration to iteration, a rank's forward and backward vary by milliseconds here, on idle
   cores too), and the iteration goes at the pace of the slowest: t_iter + w, w the time a
   rank waits per iteration, beyond the exchange itself, at the first collective it makes.
   Nothing calibrates w yet: a prediction from a calibration file has w = 0. The CPU bound
   (point 5) does not add w: ranks that wait for the slowest leave their cores to ranks
   that still compute, and the cores a wait does leave idle are in the per-step term.
7. Token buckets (``ClusterModel.burst``, default 0: a plain link): an emulated cluster's links
   are ``tc tbf`` buckets that let ``burst`` bytes through at once after an idle spell. A
   bucket's data calls start with the credit its links earned idle before them (the first
   bucket: since the iteration before sent its last, through the step, forward, backward
   until it is ready and its encode; a later one: while it waited to be ready, the last
   bucket's decode and its own encode), and the first that many bytes the busiest rank sends
   or receives cost no β (one credit for all of a bucket's calls: PowerSGD's Q gets what its
   P left; and no more than the call spends on the links between nodes). Links earn nothing
   inside a call: α per step, calibrated here, is mostly the ranks' CPU, which overlaps the
   wire in large transfers.
8. Coding on the training device (``ClusterModel.coding_slowdown``, κ_c ≥ 1; None: coding
   has resources of its own, as a CPU rank's hook thread on spare cores): a GPU computes
   backward and every encode and decode on the same device, and the compression-utility
   paper (§3.1, Figure 3) measured that running them side by side is no faster than one
   after the other. So t_iter ≥ t_f + κ_c·(κ·t_b + Σ encode_b + decode_b) + c_last + t_step;
   communication still overlaps backward, except c_last, the last bucket's (where it codes):
   it starts after that bucket's encode, which follows all of backward and every earlier
   bucket's coding, and its decode waits for it, so nothing on the device runs beside it.
9. Two latencies (``ClusterModel.alpha_transport``): the backend's collectives (gloo's or
   NCCL's allreduce: dense, fp16/bf16, PowerSGD, the gathered methods) take α per step;
   what gradwire's own executor runs, point-to-point sends and receives from Python (the
   sparse methods' schedules, the call headers), takes the executor's α, which
   ``gradwire calibrate`` measures apart.
10. Compute as the ranks run it (``ClusterModel.compute_slowdown``, ≥ 1): a profile is
   measured in one process alone, without DDP. Under DDP (its bucket copies and hooks),
   with every rank computing at once on machines they may share, forward, backward and the
   step take this factor longer; ``gradwire calibrate`` measures it on a stand-in of the
   profile's size.
11. Reductions by dtype (``ClusterModel.gamma_dtype``): a backend may add half-precision
   values far slower per byte than fp32 (gloo on a CPU converts every element; NCCL on a GPU
   does not), so a call that sums fp16 or bf16 (the casts, a half-precision model's dense
   allreduce) takes that dtype's γ, which ``gradwire calibrate`` measures on the backend.

Every time is an array over the cluster's (α, β, γ), so a sweep over bandwidths is one call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from gradwire import catalogue, config
from gradwire.bandwidth import MODEL_MOST, parse_bandwidth
from gradwire.catalogue import MODES, BucketPlan, Shapes
from gradwire.check import check_density, check_fraction, check_int, check_real, is_int
from gradwire.collectives.agree import header_spec
from gradwire.errors import GradwireError
from gradwire.perf import comm
from gradwire.perf.codecs import CodecTable
from gradwire.profiles import Profile
from gradwire.schedules import registry

MAX_WORKERS = registry.MAX_WORLD
DDP_BUCKET_MB = 25.0  # DistributedDataParallel's bucket_cap_mb
DDP_FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_workers(workers: object) -> None:
    """A one-line error unless ``workers`` is a worker count the model can price."""
    if not is_int(workers, 1, MAX_WORKERS):
        raise GradwireError(f"workers must be a whole number from 1 to {MAX_WORKERS} (the "
                            f"model costs every transfer of a schedule, P² of them for a "
                            f"ring), got {workers!r}")


@dataclass(frozen=True)
class ClusterModel:
    """P workers on links of ``link_bps`` each way; α s per message, β s per byte (default
    8/link_bps), γ s per byte reduced. Arrays of link rates give one prediction per rate.
    ``check_calls``: charge the call-header exchanges (default: as gradwire would run).
    ``ranks_per_node`` consecutive ranks share a node's link to the others and talk inside
    the node at ``intra_bps`` (α the same)."""

    workers: int
    link_bps: np.ndarray | float
    alpha: float
    gamma: float = 0.0
    beta: np.ndarray | float | None = None
    # gradwire's hooks exchange call headers (agree.py; in steady state one per bucket for
    # the methods that agree on a status first, none for the others) unless
    # GRADWIRE_CHECK_CALLS=0; the model charges their schedule when this is on.
    check_calls: bool = field(default_factory=config.check_calls)
    # Consecutive ranks per node: they share the node's link for traffic between nodes and
    # talk inside the node over a link of intra_bps (NVLink/PCIe class by default).
    ranks_per_node: int = 1
    intra_bps: float = 100e9
    # CPU the ranks share (point 5 of the module docstring): ``cpu_ranks`` ranks run on one
    # machine of ``cores`` cores (default: ranks_per_node per machine); None: every rank has
    # cores enough of its own and CPU bounds nothing. ``gradwire calibrate`` measures the rest.
    cores: float | None = None
    cpu_ranks: int | None = None
    cpu_step: float = 0.0  # CPU seconds a rank spends per schedule step it takes part in
    # CPU seconds per call of the backend's own collectives at this P, their steps included
    # (gloo's threads wake for each call), charged instead of cpu_step per step; 0: cpu_step
    cpu_call: float = 0.0
    cpu_byte: float = 0.0  # CPU seconds per byte moved, its sender's and receiver's together
    cpu_share: float = 1.0  # the share of the machine's cores the ranks keep busy
    cpu_sync: float = 0.0  # seconds each schedule step waits for a peer not yet scheduled
    cpu_slowdown: float = 1.0  # CPU of encode/decode with every rank running / alone
    # Seconds per iteration a rank waits at its first collective call for the slowest rank
    # (compute that varies from rank to rank and from iteration to iteration): point 6.
    straggle: float = 0.0
    # Bytes of each link's token bucket (an emulated cluster's tc tbf; 0: a plain link): a
    # bucket's data calls start with what the link earned while idle (point 7).
    burst: float = 0.0
    # Coding shares the device with backward (point 8): backward and every bucket's encode and
    # decode take at least this factor (≥ 1) times their sum. None: coding runs beside
    # backward on resources of its own.
    coding_slowdown: float | None = None
    # α per step of gradwire's own executor (point-to-point over the backend: the sparse
    # methods' schedules, the call headers), where it differs from the backend's
    # collectives' (point 9); None: alpha.
    alpha_transport: float | None = None
    # A rank's compute (forward, backward, step) under DDP with every rank computing at once,
    # over the profile's, measured in one process alone (point 10); 1: as profiled.
    compute_slowdown: float = 1.0
    # γ of reductions in other dtypes than fp32, as (dtype name, seconds per byte) pairs
    # (point 11); a dtype not named reduces at ``gamma``.
    gamma_dtype: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        check_workers(self.workers)
        check_int("cluster", "ranks per node", self.ranks_per_node, 1)
        if self.cpu_ranks is not None:
            check_int("cluster", "ranks per machine", self.cpu_ranks, 1)
        if not isinstance(self.check_calls, bool | np.bool_):  # "no" would be true
            raise GradwireError(f"cluster: check_calls must be True or False, got "
                                f"{self.check_calls!r}")
        # numpy's integers as Python's: the schedules and the codec table count with them
        for name in ("workers", "ranks_per_node", "cpu_ranks"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        if not _positive(self.link_bps) or np.size(self.link_bps) == 0:
            raise GradwireError(f"link rates must be finite numbers of bit/s > 0, got "
                                f"{self.link_bps!r}")
        if self.beta is None and not _positive(_per_byte(self.link_bps)):
            # a subnormal rate: β = 8/rate is inf, and every time inf or NaN (inf·0)
            raise GradwireError(f"link rates must be large enough that a byte takes a finite "
                                f"time (8/rate seconds), got {self.link_bps!r}")
        if self.beta is not None and not _positive(self.beta):
            raise GradwireError(f"beta must be finite seconds per byte > 0, got {self.beta!r}")
        check_real("alpha (seconds per message)", self.alpha)
        check_real("gamma (seconds per byte reduced)", self.gamma)
        if self.cores is not None:
            check_real("cores per machine", self.cores, above=True)
        check_fraction("cluster: CPU share", self.cpu_share)
        check_real("CPU slowdown", self.cpu_slowdown, 1.0)
        for what, v in (("CPU per step", self.cpu_step), ("CPU per byte", self.cpu_byte),
                        ("CPU per backend call", self.cpu_call),
                        ("sync wait per step", self.cpu_sync),
                        ("straggler wait per iteration", self.straggle),
                        ("token bucket (bytes)", self.burst)):
            check_real(what, v)
        check_real("the link inside a node (bit/s)", self.intra_bps, above=True)
        if not _positive(_per_byte(self.intra_bps)):
            raise GradwireError(f"the link inside a node (bit/s) must be large enough that a "
                                f"byte takes a finite time (8/rate seconds), got "
                                f"{self.intra_bps!r}")
        if self.coding_slowdown is not None:
            check_real("coding slowdown", self.coding_slowdown, 1.0)
        if self.alpha_transport is not None:
            check_real("alpha of gradwire's executor (seconds per message)",
                       self.alpha_transport)
        check_real("compute slowdown", self.compute_slowdown, 1.0)
        for pair in self.gamma_dtype:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise GradwireError(f"gamma_dtype: each entry must be a (dtype name, seconds "
                                    f"per byte) pair, got {pair!r}")
            name, g = pair
            # gamma_of looks a dtype up by its name: any other ("fp16", "half") is never used
            dtype = getattr(torch, name, None) if isinstance(name, str) else None
            if not isinstance(dtype, torch.dtype) or str(dtype) != f"torch.{name}":
                raise GradwireError(f"gamma_dtype: {name!r} is not a dtype name (e.g. "
                                    f"'float16', 'bfloat16')")
            check_real(f"gamma of {name} (seconds per byte reduced)", g)

    def gamma_of(self, dtype: torch.dtype | None) -> float:
        """γ per byte of a reduction in ``dtype`` (point 11; None: ``gamma``)."""
        if dtype is None:
            return self.gamma
        return dict(self.gamma_dtype).get(str(dtype).removeprefix("torch."), self.gamma)

    @property
    def node(self) -> comm.Node | None:
        """What :func:`gradwire.perf.comm.seconds` needs to cost several ranks per node."""
        if self.ranks_per_node == 1:
            return None
        return comm.Node(self.ranks_per_node, self.alpha, 8.0 / self.intra_bps)

    @property
    def cpu_load(self) -> float:
        """Ranks per core on a machine, at least 1: how much longer CPU work takes than on
        cores of its own (0 when CPU bounds nothing)."""
        if self.cores is None:
            return 0.0
        return max(1.0, self._machine_ranks / self.cores)

    @property
    def _machine_ranks(self) -> int:
        n = self.cpu_ranks if self.cpu_ranks is not None else self.ranks_per_node
        return min(n, self.workers)

    @property
    def beta_s(self) -> np.ndarray:
        return np.asarray(_per_byte(self.link_bps) if self.beta is None else self.beta,
                          dtype=float)


@dataclass(frozen=True)
class Aggregation:
    """A method of gradwire.hooks.METHODS with its parameters, as ``gradwire train`` runs it."""

    method: str
    density: float = 0.001
    rank: int = 4
    mode: str = "bucket"
    bucket_mb: float = DDP_BUCKET_MB
    # None: as DDP closes its first bucket, 1 MiB under its default cap and the cap itself
    # under any other (DDP given bucket_cap_mb uses it for every bucket)
    first_bucket_mb: float | None = None

    def __post_init__(self) -> None:
        catalogue.get(self.method)  # one line naming the known methods
        check_density(self.density, "density")
        if self.mode not in MODES:
            raise GradwireError(f"mode must be 'bucket' or 'model', got {self.mode!r}")
        check_int("aggregation", "PowerSGD rank", self.rank, 1)
        check_real("bucket size (MiB)", self.bucket_mb, above=True)
        if self.first_bucket_mb is not None:
            check_real("first bucket size (MiB)", self.first_bucket_mb, above=True)

    @property
    def first_bucket(self) -> float:
        """MiB at which the first bucket closes (``first_bucket_mb``, else DDP's rule)."""
        if self.first_bucket_mb is not None:
            return self.first_bucket_mb
        return DDP_FIRST_BUCKET_MB if self.bucket_mb == DDP_BUCKET_MB else self.bucket_mb

    def plan(self, numel: int, world: int, dtype: torch.dtype = torch.float32,
             shapes: Shapes | None = None) -> BucketPlan:
        """What one bucket of ``numel`` elements (tensors of ``shapes``) sends (the catalogue's
        plan)."""
        m = catalogue.get(self.method)
        options = {"rank": self.rank} if "rank" in m.options else {}
        return m.plan(numel, world, dtype, m.make_compressor(self.density, **options),
                      self.density, shapes=shapes)

    @property
    def label(self) -> str:
        m = catalogue.get(self.method)
        if m.takes_density:
            return f"{self.method} ρ={self.density:g}"
        return f"{self.method} r={self.rank}" if self.method == "powersgd" else self.method


@dataclass
class Prediction:
    """Seconds per iteration and its parts, each an array over the cluster's link rates."""

    iteration: np.ndarray
    forward: float
    backward: float  # κ·t_b, as it runs beside communication
    step: float
    communicate: np.ndarray  # Σ comm_b
    coding: float  # Σ encode_b + decode_b
    exposed: np.ndarray  # what backward did not hide: t_iter − t_f − κ·t_b − t_step
    wire_bytes: int  # one rank's payload per iteration (0 for one worker: nothing is sent)
    buckets: int
    notes: list[str] = field(default_factory=list)
    cpu: float = 0.0  # D: CPU seconds one rank spends per iteration (point 5)
    cpu_comm: float = 0.0  # its part in the schedules
    # max(1, n/C)·D/u + S·s, 0 when the cluster's CPU bounds nothing
    cpu_bound: float = 0.0
    calls: int = 0  # collective calls per iteration, headers included
    steps: float = 0.0  # S: schedule steps a rank takes part in per iteration (when shared)
    header: float | np.ndarray = 0.0  # seconds of the call-header exchanges (in communicate)
    # t_f + κ_c·(κ·t_b + coding) + c_last + t_step (point 8)
    device_bound: float | np.ndarray = 0.0
    backward_alone: float | None = None  # t_b, without communication beside it (None: backward)

    @property
    def efficiency(self) -> np.ndarray:
        """(t_f + t_b)/t_iter (point 4): the slowdown κ of backward beside communication
        counts against it, as the communication it comes from does."""
        t_b = self.backward if self.backward_alone is None else self.backward_alone
        it = np.asarray(self.iteration, dtype=float)
        # an iteration of no time (a profile of zero compute on one worker) loses nothing
        # to communication: 1, where 0/0 would be NaN
        return np.divide(self.forward + t_b, it, out=np.ones_like(it), where=it > 0)


def _groups(profile: Profile, agg: Aggregation) -> list[tuple[list[int], float]]:
    """The tensors (indices into ``profile.params``) of each bucket and its backward seconds
    until ready, in the order the buckets fill."""
    times = profile.layer_backward_s()
    if agg.mode == "model":
        return [(list(range(len(profile.params))), sum(times))]
    out: list[tuple[list[int], float]] = []
    held: list[int] = []
    n, t = 0, 0.0
    cap = agg.first_bucket * 2**20
    for i, ((_, size), dt) in enumerate(zip(profile.params, times, strict=True)):
        held.append(i)
        n, t = n + size, t + dt
        if n * profile.itemsize >= cap:
            out.append((held, t))
            held, n, cap = [], 0, agg.bucket_mb * 2**20
    if held:
        out.append((held, t))
    return out


def _buckets(profile: Profile, agg: Aggregation
             ) -> list[tuple[int, float, Shapes | None]]:
    """(elements, backward seconds until ready, the tensors' shapes or None where the profile
    does not give them all) of each bucket, in the order they fill."""
    out: list[tuple[int, float, Shapes | None]] = []
    for held, t in _groups(profile, agg):
        shapes = None
        if profile.shapes is not None and all(profile.shapes[i] is not None for i in held):
            shapes = tuple(profile.shapes[i] for i in held)  # type: ignore[misc]
        out.append((sum(profile.params[i][1] for i in held), t, shapes))
    return out


def buckets(profile: Profile, agg: Aggregation) -> list[tuple[int, float]]:
    """(elements, backward seconds until ready) of each bucket, in the order they fill."""
    return [(n, t) for n, t, _ in _buckets(profile, agg)]


def operations(agg: Aggregation, numel: int, world: int, dtype: str = "float32",
               shapes: Shapes | None = None
               ) -> tuple[list[tuple[str, str, int, int, dict]], int, list[torch.dtype | None],
                          bool]:
    """The collectives one bucket of ``numel`` elements (tensors of ``shapes``, None: one flat
    tensor) runs, as (collective, algorithm, count, bytes per element, params), this rank's
    payload bytes, the dtype each call reduces in, and whether the bucket goes dense (no
    coding; torch.distributed's allreduce): the catalogue's plan for the hooks' defaults
    (torch.distributed's own collectives)."""
    plan = agg.plan(numel, world, DTYPES[dtype], shapes)
    return ([(c.collective, c.algo, c.count, c.itemsize, c.params) for c in plan.calls],
            plan.sent, [c.dtype for c in plan.calls], plan.dense)


def bytes_sent(agg: Aggregation, numel: int, world: int, dtype: str = "float32",
               shapes: Shapes | None = None) -> np.ndarray:
    """Bytes each rank sends for one bucket (tensors of ``shapes``, None: one flat tensor) in
    the collectives the model prices (:func:`operations`), the call header's exchange not
    included."""
    sent = np.zeros(world, dtype=np.int64)
    for c, a, n, e, prm in operations(agg, numel, world, dtype, shapes)[0]:
        sent += comm.bytes_sent(c, a, world, n, e, **prm)
    return sent


def _per_byte(bps: object) -> np.ndarray:
    """Seconds per byte, 8/rate, of link rates of bit/s (inf where a rate is subnormal)."""
    with np.errstate(over="ignore", divide="ignore"):
        return 8.0 / np.asarray(bps, dtype=float)


def _positive(v: object) -> bool:
    """Whether ``v`` is a finite real number > 0 or a 1-D array of them (not text, not bool)."""
    a = np.asarray(v) if not isinstance(v, str) else None
    return (a is not None and a.dtype.kind in "iuf" and a.ndim <= 1
            and bool((np.isfinite(a) & (a > 0)).all()))


def check_compute(profile: Profile, compute_speedup: float, overlap_slowdown: float) -> None:
    """A one-line error unless ``profile`` has compute times and the compute speedup (> 0)
    and κ (>= 1) are finite: what :func:`predict` and the what-if answers scale them by."""
    if not profile.has_compute:
        raise GradwireError(f"profile {profile.model!r} has no compute times "
                            f"({profile.sources.get('backward_s', 'no source')}); give "
                            f"--compute-ms FORWARD,BACKWARD or a measured profile")
    check_real("compute speedup", compute_speedup, above=True)
    check_real("overlap slowdown", overlap_slowdown, 1.0)


def predict(profile: Profile, cluster: ClusterModel, agg: Aggregation, codecs: CodecTable,
            compute_speedup: float = 1.0, overlap_slowdown: float = 1.0) -> Prediction:
    """Iteration time of ``agg`` for ``profile`` on ``cluster`` (see the module docstring),
    with compute ``compute_speedup`` times faster than the profile's and backward
    ``overlap_slowdown`` (κ) times slower beside communication."""
    check_compute(profile, compute_speedup, overlap_slowdown)
    p = cluster.workers
    alpha, beta, gamma = cluster.alpha, cluster.beta_s, cluster.gamma
    bs = _buckets(profile, agg)
    kappa = overlap_slowdown if len(bs) > 1 and p > 1 else 1.0
    shared = cluster.cores is not None  # point 5: ranks share cores
    end = np.zeros_like(beta)
    total_comm, coding, wire, cpu_comm, calls = np.zeros_like(beta), 0.0, 0, 0.0, 0
    steps = 0.0
    # point 5: on shared cores every rank codes at once
    stretch = cluster.cpu_load * cluster.cpu_slowdown / cluster.cpu_share if shared else 1.0
    header = np.zeros_like(beta)
    zero = np.zeros_like(beta)
    tail = zero  # point 8: what the device waits for after its last work
    unit = cluster.compute_slowdown / compute_speedup  # point 10: compute as the ranks run it
    f = profile.forward_s * unit  # type: ignore[operator]
    s = profile.step_s * unit
    # point 9: the executor's α for what runs on gradwire's transport
    alpha_t = alpha if cluster.alpha_transport is None else cluster.alpha_transport
    credited, last_dec = cluster.burst > 0 and p > 1, 0.0
    # In steady state (no density warm-up) the hooks exchange no header, unless a method's
    # NaN/Inf status cannot travel with its data: then one before every bucket.
    method = catalogue.get(agg.method)
    in_band = method.path.in_band(method)
    # inside a node as between nodes, a message takes the α of what sends it (point 9)
    node_a, node_t = ((None, None) if cluster.node is None
                      else (replace(cluster.node, alpha=alpha),
                            replace(cluster.node, alpha=alpha_t)))
    for i, (numel, ready, shapes) in enumerate(bs):
        data, sent, dtypes, dense = operations(agg, numel, p, profile.dtype, shapes)
        # a bucket the method would not make smaller goes dense: torch.distributed's
        # allreduce, nothing encoded
        on_transport = method.path.on_transport and not dense
        alpha_d, node_d = (alpha_t, node_t) if on_transport else (alpha, node_a)
        gammas = [cluster.gamma_of(d) for d in dtypes]
        enc, dec = (codecs.seconds(agg.method, numel, p) if p > 1 and not dense
                    else (0.0, 0.0))
        enc, dec = enc / compute_speedup, dec / compute_speedup
        if credited:
            # what the link earned idle before this bucket's data (point 7): the first bucket,
            # since the iteration before sent its last (step, forward, backward until ready,
            # encode); a later one, while it waited to be ready, the last bucket's decode and
            # its own encode; no credit left over from the bucket before
            idle = (f + s + kappa * ready * unit if i == 0
                    else np.maximum(kappa * ready * unit - end, 0.0) + last_dec)
            # encode and decode as long as they take in the timeline (point 5: shared cores)
            credit = np.minimum(cluster.burst, (idle + enc * stretch) / beta)
            last_dec = dec * stretch
        t = zero
        for (c, a, n, e, prm), g in zip(data, gammas, strict=True):
            call = comm.seconds(c, a, p, n, e, alpha_d, beta, g, node=node_d, **prm)
            if credited:
                # the credit is the links', not each call's: what one call spends, the
                # next (PowerSGD's Q after its P) no longer has
                saved, credit = _credit_saved(c, a, p, n, e, prm, alpha_d, beta, g, node_d,
                                              credit, call)
                call = call - saved
            t = t + call
        ops = data
        if cluster.check_calls and p > 1 and not in_band:
            c, a, n, prm = header_spec(p)
            ops, gammas = [(c, a, n, 1, prm), *data], [gamma, *gammas]
            h = comm.seconds(c, a, p, n, 1, alpha_t, beta, gamma, node=node_t, **prm)
            header, t = header + h, t + h
        calls += len(ops) if p > 1 else 0
        if shared:
            steps += sum(comm.steps(c, a, p, n, **prm) for c, a, n, _, prm in ops)
            # the backend's own data calls cost cpu_call each, their steps included; the
            # executor's (headers first, sparse schedules) cpu_step per step
            per_call = not on_transport and cluster.cpu_call > 0
            headers = len(ops) - len(data)
            cpu_comm += sum(comm.cpu_seconds(c, a, p, n, e,
                                             0.0 if per_call and j >= headers
                                             else cluster.cpu_step,
                                             cluster.cpu_byte, float(np.max(g)), **prm)
                            for j, ((c, a, n, e, prm), g) in enumerate(
                                zip(ops, gammas, strict=True)))
            cpu_comm += cluster.cpu_call * len(data) if per_call else 0.0
        end = np.maximum(end, kappa * ready * unit) + (enc + dec) * stretch + t
        total_comm, coding = total_comm + t, coding + enc + dec
        # point 8: the last bucket's messages wait for its encode, which waits for all of
        # backward and every earlier bucket's coding (one FIFO thread); its decode waits for
        # them: the device idles through them, whatever it shares
        tail = t if enc + dec > 0 else zero
        wire += sent if p > 1 else 0  # one worker sends nothing
    b = kappa * profile.backward_s * unit  # type: ignore[operator]
    done = np.maximum(end, b)
    wait = cluster.straggle if p > 1 else 0.0
    it = f + done + s + wait
    own = f + profile.backward_s * unit + s  # type: ignore[operator]
    cpu = own + coding * (cluster.cpu_slowdown if shared else 1.0) + cpu_comm
    bound = (cluster.cpu_load * cpu / cluster.cpu_share + steps * cluster.cpu_sync
             if shared else 0.0)
    device = (f + cluster.coding_slowdown * (b + coding) + tail + s
              if cluster.coding_slowdown is not None and p > 1 else 0.0)
    bound_it = np.maximum(np.maximum(it, bound), device)
    exposed = done - b + wait + (bound_it - it)
    return Prediction(bound_it, f, b, s, total_comm, coding, exposed, wire, len(bs), cpu=cpu,
                      cpu_comm=cpu_comm, cpu_bound=bound, calls=calls, steps=steps,
                      header=header, device_bound=device,
                      backward_alone=profile.backward_s * unit)  # type: ignore[operator]


def _credit_saved(collective: str, algo: str, p: int, count: int, elem_bytes: int,
                  params: dict, alpha: float, beta: np.ndarray, gamma: float,
                  node: comm.Node | None, credit: np.ndarray, seconds: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(seconds a collective of ``seconds`` saves when every link starts it with ``credit``
    bytes of token bucket, the credit left after it) (point 7): the first ``credit`` bytes
    the busiest rank sends or receives pass at once. Links earn nothing inside the call: α per
    step, as calibrated here, is mostly the ranks' CPU, which overlaps the wire in large
    transfers. The bucket is on the links between nodes: it saves at most what the call
    spends on them (traffic inside a node, over its own link, gains nothing)."""
    most = comm.busiest_bytes(collective, algo, p, count, elem_bytes, **params)
    used = np.minimum(credit, most)
    free = comm.seconds(collective, algo, p, count, elem_bytes, alpha, 0.0, gamma, node=node,
                        **params)  # the call with the links between nodes free
    saved = np.minimum(np.asarray(beta, dtype=float) * used, seconds - free)
    return saved, credit - used


def parse_link(text: str) -> float:
    """A link rate like "10gbit" in bits per second (``none`` is not a rate here), up to
    :data:`~gradwire.bandwidth.MODEL_MOST`: a node's NVLink is past what tc shapes."""
    return float(parse_bandwidth(text, unshaped=False, most=MODEL_MOST))  # type: ignore[arg-type]
