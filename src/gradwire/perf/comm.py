"""Communication time of any collective from its schedule, fast enough for P = 1024 sweeps.

A schedule's cost (:mod:`gradwire.schedules.cost`) needs, per step, each rank's messages and
bytes out, in and reduced (with several ranks per node, split into traffic inside the node
and the node's shared traffic to the others: :class:`Node`). :func:`summary` reads them from
the schedule once and keeps, per step, only the distinct per-rank rows, and merges steps whose
rows are identical (a ring's 2(P−1) steps become two row sets, the reduce-scatter's and the
allgather's, each with multiplicity P−1).
:func:`seconds` then costs the summary for any number of (α, β, γ) at once: with one rank per
node it is exactly ``cost()`` of the same schedule.

Messages of ``ref_count(P)`` = lcm(P, 2^⌈lg P⌉)·pipeline elements or more reuse the summary
at that count: there the blocks of the algorithms the model uses (ring, recursive doubling
and halving, trees) are all equal and non-empty, so the messages are the same at any larger
count and the bytes grow in proportion to it. Blocks then differ from the schedule built at
the real count by at most one element each, adding at most (β+γ)·itemsize per message:
relative to the α every message pays, about 1e-4 at this cluster's calibration.
``tests/test_perf_model.py`` holds the exact and the scaled case against ``cost()`` for
P = 1…17. An algorithm whose parameters are chosen from the count (the linear pipeline's
block) must be given them explicitly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from gradwire.check import is_int
from gradwire.errors import GradwireError
from gradwire.schedules import registry, ring
from gradwire.schedules.ir import Schedule, Table, blocks

_HASH = np.array([1.0, 2.0**-20, np.pi, np.e * 2.0**-20, np.sqrt(2) * 2.0**-21, np.sqrt(3),
                  np.sqrt(5) * 2.0**-20, np.sqrt(7), np.sqrt(11) * 2.0**-21])
_BLOCK_ROWS = 2**21  # (step, rank) pairs summarised at once: about 150 MB of rows


def _hash(columns: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """A number per row, the same for equal rows, from the rows' columns (``columns[j]``:
    column j of :data:`COLUMNS`, of any shape): a column at a time, as ``rows @ _HASH`` (a
    BLAS product) can sum two equal rows in another order and tell them apart by an ulp,
    which kept both. Element by element, so a row hashes to the same bits in any array."""
    h = columns[0] * _HASH[0]
    for j in range(1, len(columns)):
        h += columns[j] * _HASH[j]
    return h


def _distinct(rows: np.ndarray) -> np.ndarray | None:
    """The distinct rows of ``rows`` as :func:`summarise` keeps a step's (ordered by
    :func:`_hash`); None where two distinct rows share a hash, as then which one summarise
    keeps could depend on their order."""
    first_of = _first_of_each_hash(_hash(rows.T)[None])[1]
    if len(np.unique(rows, axis=0)) != len(first_of):
        return None
    return rows[first_of]


def _first_of_each_hash(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of ``h`` [step, rank] (row hashes), each step's distinct hashes in increasing order,
    each by the first rank that has it, as (steps, ranks) in step order: what
    ``np.unique(h[i], return_index=True)`` gives (a stable sort), for all steps at once."""
    order = np.argsort(h, axis=1, kind="stable")
    ordered = np.take_along_axis(h, order, axis=1)
    first = np.ones(h.shape, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    step, at = np.nonzero(first)
    return step, order[step, at]


@dataclass(frozen=True)
class Summary:
    """``groups``: (steps, rows) pairs; rows[i] is one rank in one step: its intra-node
    messages and bytes out and in, its node's inter-node messages (the most any of the node's
    ranks sends or receives) and bytes (all of them, sharing the node's link) out and in, and
    the bytes it reduces; bytes counted in elements of the schedule at ``count`` elements.
    With one rank per node every transfer is inter-node and a node's traffic is the rank's."""

    count: int
    groups: tuple[tuple[int, np.ndarray], ...]


COLUMNS = ("m_out_intra", "b_out_intra", "m_in_intra", "b_in_intra",
           "m_out_node", "b_out_node", "m_in_node", "b_in_node", "b_reduced")


def summarise(s: Schedule | Table, ranks_per_node: int = 1) -> Summary:
    """The schedule's steps as per-rank rows (:class:`Summary`), ranks r·G … r·G+G−1 on node
    r for G = ``ranks_per_node`` (as torchrun places them). Read from the schedule's arrays
    (:class:`~gradwire.schedules.ir.Table`), a block of steps at a time."""
    t = s if isinstance(s, Table) else Table.of(s)
    # a node of more ranks than there are is one node of them all (its rows would be padded to
    # the ranks it names: gigabytes for a mistyped count)
    p = t.world_size
    g = max(1, min(ranks_per_node, p))
    node = np.arange(p) // g
    n_steps = int(t.step[-1]) + 1 if len(t.step) else 0
    block = max(1, _BLOCK_ROWS // max(p, 1))  # steps per block: bounds the [step, rank] arrays
    edges = np.searchsorted(t.step, np.arange(0, n_steps + block, block))
    seen: dict[bytes, list] = {}
    for b, lo in enumerate(range(0, n_steps, block)):
        k = min(block, n_steps - lo)
        columns = _columns(t, slice(edges[b], edges[b + 1]), lo, k, node, g)
        # each step's distinct rows, ordered by hash, with no Python loop over a step's ranks
        step, rank = _first_of_each_hash(_hash(columns))
        # floats in a block with no transfers too (numpy's bincount of nothing is int64)
        rows = np.stack([c[step, rank] for c in columns], axis=1, dtype=float)
        ends = np.cumsum(np.bincount(step, minlength=k))
        for r in np.split(rows, ends[:-1]):
            key = r.tobytes()
            if key in seen:
                seen[key][0] += 1
            else:
                seen[key] = [1, r]
    return Summary(t.count, tuple((m, r) for m, r in seen.values()))


def _columns(t: Table, part: slice, first: int, k: int, node: np.ndarray, g: int
             ) -> list[np.ndarray]:
    """Steps ``first`` … ``first+k−1`` of the table (its entries ``part``) as per-rank rows,
    a column at a time: one [step, rank] array per column of :data:`COLUMNS`."""
    p, nodes = len(node), int(node[-1]) + 1
    step = t.step[part] - first
    src, dst, n, red = t.src[part], t.dst[part], t.size[part], t.reduces[part]
    intra = node[src] == node[dst]
    at_src, at_dst = step * p + src, step * p + dst
    # each rank its own node: the node's index is the rank's
    node_src, node_dst = ((at_src, at_dst) if g == 1 else
                          (step * nodes + node[src], step * nodes + node[dst]))

    def per(at: np.ndarray, weights: np.ndarray, width: int = p) -> np.ndarray:
        return np.bincount(at, weights, k * width).reshape(k, width)

    ni, ne = n * intra, n * ~intra
    m_out_e, m_in_e = per(at_src, ~intra), per(at_dst, ~intra)
    b_out_e, b_in_e = per(node_src, ne, nodes), per(node_dst, ne, nodes)
    if g == 1:
        top_out, top_in, spread = m_out_e, m_in_e, slice(None)
    else:  # the most messages any rank of a node sends (receives) between nodes
        pad = ((0, 0), (0, nodes * g - p))
        top_out = np.pad(m_out_e, pad).reshape(k, nodes, g).max(axis=2)
        top_in = np.pad(m_in_e, pad).reshape(k, nodes, g).max(axis=2)
        spread = node
    if intra.any():
        inside = [per(at_src, intra), per(at_src, ni), per(at_dst, intra), per(at_dst, ni)]
    else:  # no transfer inside a node (one rank per node): 4 of the 9 columns are zero
        inside = [np.zeros((k, p))] * 4
    return [*inside, top_out[:, spread], b_out_e[:, spread], top_in[:, spread],
            b_in_e[:, spread], per(at_dst, n * red)]


def ref_count(p: int, pipeline: object = 1) -> int:
    """Elements from which summaries are scaled rather than built (see the module docstring)."""
    p = int(p)  # numpy's integers have no bit_length
    return math.lcm(p, 1 << (p - 1).bit_length()) * (int(pipeline) if is_int(pipeline, 1) else 1)


@functools.lru_cache(maxsize=512)
def _summary(collective: str, algo: str, p: int, count: int,
             params: tuple[tuple[str, object], ...], ranks_per_node: int) -> Summary:
    phases = _ring_phases(collective, algo, p, count, dict(params))
    found = None
    if phases is not None:
        found = (ring_summary(p, count, phases) if ranks_per_node == 1
                 else ring_node_summary(p, count, phases, ranks_per_node))
    return found or summarise(registry.table(collective, algo, p, count, cached=False,
                                             **dict(params)), ranks_per_node)


# The ring's phases (ring.py) by the table builder the registry holds for it
_RING_PHASES = {ring.allreduce_table: ring.ALLREDUCE, ring.reducescatter_table:
                ring.REDUCE_SCATTER, ring.allgather_table: ring.ALLGATHER}


def _ring_phases(collective: str, algo: str, p: object, count: object, params: dict
                 ) -> tuple[tuple[int, bool], ...] | None:
    """The phases of ``registry.table(collective, algo, p, count, **params)`` where it is a
    ring of one sub-chunk per chunk, of 2 ranks or more and 1 element or more
    (:func:`ring_summary` and :func:`ring_node_summary` summarise it without building it);
    None for anything else, which is built (and refused there where the arguments are
    wrong)."""
    if (not is_int(p, 2, registry.MAX_WORLD) or not is_int(count, 1)
            or not set(params) <= {"pipeline", "itemsize"}):
        return None
    try:
        a = registry.get(collective, algo)
        phases = _RING_PHASES.get(a.table)  # type: ignore[arg-type]
        if phases is None:
            return None
        registry.check_params(a, params)
        cut = ring.pick_pipeline(int(p), int(count), params.get("pipeline"),  # type: ignore
                                 params.get("itemsize", 4))  # type: ignore[arg-type]
    except (GradwireError, TypeError, ValueError):
        return None
    return phases if cut == 1 else None


@functools.lru_cache(maxsize=512)
def ring_summary(p: int, count: int, phases: tuple[tuple[int, bool], ...]) -> Summary | None:
    """:func:`summarise` of ``ring_table(p, count, phases, 1)`` on one rank per node, from the
    first step of each phase: a phase's later steps are its first with the ranks rotated (at
    step i rank r sends chunk (r + first − i) mod p), so they hold the same rows and each
    phase is one group of p − 1 steps. Built whole, the schedule has 2(P − 1)·P transfers:
    seconds at P = 4095, for every bucket below ``ref_count`` (16.8 M elements there). Rows
    are deduplicated as summarise does (on a hash of each row); None where two distinct rows
    share a hash, as then which one summarise keeps could depend on the rotation."""
    size = np.array([n for _, n in blocks(count, p)], dtype=np.int64)
    ranks = np.arange(p)
    zero = np.zeros(p)
    seen: dict[bytes, list] = {}
    for first, reduces in phases:
        out, into = size[(ranks + first) % p], size[(ranks - 1 + first) % p]
        rows = np.stack([zero, zero, zero, zero, (out > 0).astype(float), out.astype(float),
                         (into > 0).astype(float), into.astype(float),
                         (into * reduces).astype(float)], axis=1)
        r = _distinct(rows)
        if r is None:
            return None
        key = r.tobytes()
        if key in seen:
            seen[key][0] += p - 1
        else:
            seen[key] = [p - 1, r]
    return Summary(count, tuple((m, r) for m, r in seen.values()))


@functools.lru_cache(maxsize=512)
def ring_node_summary(p: int, count: int, phases: tuple[tuple[int, bool], ...],
                      ranks_per_node: int) -> Summary | None:
    """:func:`summarise` of ``ring_table(p, count, phases, 1)`` on ``ranks_per_node`` ranks
    per node (consecutive ranks), without building its 2(P − 1)·P transfers. Each rank sends
    to the next, so a node's one link out is its last rank's send and its one link in its
    first rank's receive. At step i of a phase rank r sends chunk (r + s) mod p, s = first − i,
    and a chunk holds q = ⌊count/p⌋ elements or one more: a rank's row is set by whether each
    link is inside the node or not and by which size four chunks have (the one it sends, the
    one it receives, its node's sent and its node's received). So each shift s is the set of
    those codes present (at most 64, a bit mask), computed for every s at once, and each step
    the rows of its shift's codes, deduplicated and ordered as summarise orders them; None
    where two distinct rows share a hash (see :func:`ring_summary`)."""
    g = max(1, min(ranks_per_node, p))
    q = count // p
    big = np.array([n > q for _, n in blocks(count, p)], dtype=np.uint8)
    ranks = np.arange(p)
    node = ranks // g
    prev = (ranks - 1) % p
    out_inter, in_inter = node != node[(ranks + 1) % p], node[prev] != node
    multi = bool(out_inter.any())  # two nodes or more: links between nodes
    sender, receiver = np.zeros(node[-1] + 1, dtype=np.int64), np.zeros_like(node)
    sender[node[out_inter]], receiver[node[in_inter]] = ranks[out_inter], ranks[in_inter]
    # at shift s rank x sends chunk x + s: row s of ``sent`` (a view of big twice over) is
    # whether each rank's chunk is a large one; the other three bits are its columns r − 1
    # (what r receives), its node's sender's and the one before its node's receiver
    sent = np.lib.stride_tricks.sliding_window_view(np.concatenate([big, big]), p)
    others = [(1, prev), (2, sender[node] if multi else ranks),
              (3, prev[receiver[node]] if multi else ranks)]
    role = (out_inter.astype(np.uint8) + 2 * in_inter.astype(np.uint8)) << 4
    present = np.zeros((p, 64), dtype=bool)
    block = max(1, _BLOCK_ROWS // p)
    for lo in range(0, p, block):
        own = sent[lo:min(lo + block, p)]
        code = own + role
        for bit, where in others:
            code += np.take(own, where, axis=1) << bit
        k = len(own)
        present[lo:lo + k] = np.bincount((np.arange(k)[:, None] * 64 + code).ravel(),
                                         minlength=k * 64).reshape(k, 64) > 0
    masks = (present.astype(np.uint64) << np.arange(64, dtype=np.uint64)).sum(
        axis=1, dtype=np.uint64)
    seen: dict[bytes, list] = {}
    made: dict[tuple[int, bool], bytes | None] = {}
    for first, reduces in phases:
        for i in range(p - 1):
            mask = int(masks[(first - i) % p])
            if (mask, reduces) not in made:
                made[(mask, reduces)] = _node_rows(mask, q, reduces, multi, seen)
            key = made[(mask, reduces)]
            if key is None:
                return None
            seen[key][0] += 1
    return Summary(count, tuple((m, r) for m, r in seen.values()))


def _node_rows(mask: int, q: int, reduces: bool, multi: bool, seen: dict[bytes, list]
               ) -> bytes | None:
    """The rows of ``mask``'s codes (:func:`ring_node_summary`) as summarise keys them, put
    in ``seen`` (with no step yet) where new; None where two distinct rows share a hash."""
    code = np.array([c for c in range(64) if mask >> c & 1], dtype=np.int64)
    out, into, node_out, node_in = (q + (code >> b & 1) for b in range(4))
    inside_out, inside_in = (code >> 4 & 1) == 0, (code >> 5 & 1) == 0
    rows = np.stack([inside_out & (out > 0), inside_out * out, inside_in & (into > 0),
                     inside_in * into, multi & (node_out > 0), multi * node_out,
                     multi & (node_in > 0), multi * node_in, into * reduces],
                    axis=1).astype(float)
    r = _distinct(rows)
    if r is None:
        return None
    key = r.tobytes()
    seen.setdefault(key, [0, r])
    return key


def summary(collective: str, algo: str, p: int, count: int, ranks_per_node: int = 1,
            **params: object) -> Summary:
    """The summary of ``registry.schedule(collective, algo, p, count, **params)`` (cached; a
    count above ``ref_count(p)`` reuses that count's summary)."""
    return _summary(collective, algo, p, *_reference(p, count, params), ranks_per_node)


def _reference(p: int, count: int, params: dict[str, object]) -> tuple[int, tuple]:
    """The count a schedule is built at for ``count`` elements (at most ``ref_count``) and
    ``params`` as a cache key."""
    return min(count, ref_count(p, params.get("pipeline"))), tuple(sorted(params.items()))


def seconds(collective: str, algo: str, p: int, count: int, elem_bytes: float,
            alpha: np.ndarray | float, beta: np.ndarray | float, gamma: np.ndarray | float = 0.0,
            *, node: Node | None = None, **params: object) -> np.ndarray:
    """Predicted seconds of the collective on ``count`` elements of ``elem_bytes`` bytes, for
    each (α, β, γ) given (arrays broadcast): ``cost()`` of its schedule. ``node``: several
    ranks per node (:class:`Node`); then a node's ranks share its link (α, β) for traffic
    between nodes, and traffic inside a node takes the node's own α and β."""
    if p == 1 or count == 0:
        return np.zeros(np.broadcast(alpha, beta, gamma).shape)
    # no node holds more ranks than the cluster has: one of more is one of them all
    g = min(node.ranks, p) if node is not None and node.ranks > 1 else 1
    s = summary(collective, algo, p, count, g, **params)
    scale = elem_bytes * count / s.count
    a, b, y = (np.asarray(v, dtype=float)[..., None] for v in (alpha, beta, gamma))
    ai, bi = ((np.asarray(v, dtype=float)[..., None] for v in (node.alpha, node.beta))
              if g > 1 else (a, b))
    total = 0.0
    for steps, rows in s.groups:
        c = rows.T
        t = np.maximum(np.maximum(ai * c[0] + bi * scale * c[1], ai * c[2] + bi * scale * c[3]),
                       np.maximum(a * c[4] + b * scale * c[5], a * c[6] + b * scale * c[7]))
        total = total + steps * (t + y * scale * c[8]).max(axis=-1)
    return np.asarray(total)


@dataclass(frozen=True)
class Node:
    """``ranks`` ranks per node (consecutive ranks, as torchrun places them), talking inside
    the node at ``alpha`` s per message and ``beta`` s per byte (NVLink, PCIe, shared memory)."""

    ranks: int = 1
    alpha: float = 0.0
    beta: float = 0.0


def cpu_seconds(collective: str, algo: str, p: int, count: int, elem_bytes: float,
                per_step: float, per_byte: float, gamma: float = 0.0,
                **params: object) -> float:
    """CPU seconds a rank spends on the collective, the mean over ranks (ranks sharing cores
    share the sum): per step it takes part in (sends or receives), ``per_step``; per byte it
    moves, half of ``per_byte`` (the CPU a byte costs its sender and its receiver together);
    per byte it reduces, ``gamma``. Counted on the schedule at ``min(count, ref_count(P))``
    elements, bytes scaled to ``count`` as :func:`seconds` does."""
    if p == 1 or count == 0:
        return 0.0
    c0, key = _reference(p, count, params)
    steps, moved, reduced = _cpu_totals(collective, algo, p, c0, key)
    scale = elem_bytes * count / c0
    return steps * per_step + scale * (moved * per_byte / 2 + reduced * gamma)


def steps(collective: str, algo: str, p: int, count: int, **params: object) -> float:
    """Schedule steps a rank takes part in (sends or receives), the mean over ranks, as
    :func:`cpu_seconds` counts them."""
    return cpu_seconds(collective, algo, p, count, 1, 1.0, 0.0, **params)


def busiest_bytes(collective: str, algo: str, p: int, count: int, elem_bytes: float,
                  **params: object) -> float:
    """Bytes the busiest rank sends, or receives, over the whole collective (the larger):
    what a token bucket's credit can save it (:func:`gradwire.perf.model.predict`, point 7).
    Counted as :func:`cpu_seconds` counts, scaled from ``min(count, ref_count(P))``."""
    if p == 1 or count == 0:
        return 0.0
    c0, key = _reference(p, count, params)
    return _busiest(collective, algo, p, c0, key) * elem_bytes * count / c0


def bytes_sent(collective: str, algo: str, p: int, count: int, elem_bytes: int,
               **params: object) -> np.ndarray:
    """Bytes each rank sends in the collective, counted exactly on its schedule at ``count``
    (:func:`seconds` prices counts above ``ref_count(P)`` from a scaled summary)."""
    return registry.table(collective, algo, p, count, **params).sent() * elem_bytes


@functools.lru_cache(maxsize=512)
def _busiest(collective: str, algo: str, p: int, count: int,
             params: tuple[tuple[str, object], ...]) -> float:
    phases = _ring_phases(collective, algo, p, count, dict(params))
    if phases is not None:
        return _ring_totals(p, count, phases)[1]
    t = registry.table(collective, algo, p, count, cached=False, **dict(params))
    return float(max(t.sent().max(), t.received().max()))


@functools.lru_cache(maxsize=512)
def _cpu_totals(collective: str, algo: str, p: int, count: int,
                params: tuple[tuple[str, object], ...]) -> tuple[float, float, float]:
    """Per rank, the mean over ranks: steps it takes part in, elements it sends plus those it
    receives, elements it reduces."""
    phases = _ring_phases(collective, algo, p, count, dict(params))
    if phases is not None:
        return _ring_totals(p, count, phases)[0]
    t = registry.table(collective, algo, p, count, cached=False, **dict(params))
    n_steps = int(t.step[-1]) + 1 if len(t.step) else 0
    taking_part = np.zeros(n_steps * p, dtype=bool)  # [step, rank]: sends or receives
    taking_part[t.step * p + t.src] = True
    taking_part[t.step * p + t.dst] = True
    busy = int(taking_part.sum())
    moved, reduced = 2 * int(t.size.sum()), int(t.size[t.reduces].sum())
    return busy / p, moved / p, reduced / p


@functools.lru_cache(maxsize=512)
def _ring_totals(p: int, count: int, phases: tuple[tuple[int, bool], ...]
                 ) -> tuple[tuple[float, float, float], float]:
    """:func:`_cpu_totals` and :func:`_busiest` of an unpipelined ring (:func:`_ring_phases`)
    from the first step of each phase, as :func:`ring_summary` reads it: every step of a
    phase is its first with the ranks rotated, so each rank sends every chunk but one in a
    phase (rank r all but chunk r + first + 1) and receives every chunk but chunk r + first."""
    size = np.array([n for _, n in blocks(count, p)], dtype=np.int64)
    ranks, total = np.arange(p), int(size.sum())
    busy = moved = reduced = 0
    sent, received = np.zeros(p, dtype=np.int64), np.zeros(p, dtype=np.int64)
    for first, reduces in phases:
        out, into = size[(ranks + first) % p], size[(ranks - 1 + first) % p]
        busy += (p - 1) * int(((out > 0) | (into > 0)).sum())
        moved += 2 * (p - 1) * int(out.sum())
        reduced += (p - 1) * int(into.sum()) if reduces else 0
        sent += total - size[(ranks + first + 1) % p]
        received += total - size[(ranks + first) % p]
    return (busy / p, moved / p, reduced / p), float(max(sent.max(), received.max()))
