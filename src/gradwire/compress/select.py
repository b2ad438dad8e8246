"""Selecting the k largest |x|: the one top-k selector of gradwire, exact or by a sampled
threshold, with one tie rule.

Tie rule: among elements of equal |x| the smaller index is taken first, so ranks, runs, the
selectors and the reference in the tests agree bit for bit. A NaN counts as larger than any
number (as in torch.topk): it is selected and sent, and shows up in the result as it would in a
dense allreduce, instead of silently stopping the selection.

- ``exact``: one torch.topk for the k-th largest value, one compare, the tied elements only
  when several equal it (:func:`largest`).
- ``threshold``: about one pass over x (:func:`threshold_topk`): a threshold from a sample,
  every element above it as a candidate, the exact top k of the candidates. The candidates
  hold every element above the threshold, so the result is the exact selector's, ties
  included.
- DGC's selection (:func:`dgc_select`, Lin et al. 2018) runs the same threshold passes but
  accepts a count near k instead of correcting to exactly k.

All return int64 indices: the set is the rule's; their order is not (torch.topk's where it has
no tie to break, ascending otherwise).

On the device path (:mod:`gradwire.syncfree`: CUDA tensors, or any under ``device_paths()``)
:func:`select` makes no host-device synchronisation and returns exactly min(k, n) distinct
indices in ascending order: :func:`device_exact` (the rule's set, always) and
:func:`device_threshold` (the rule's set unless its sample misses: a few calls in 10⁵ for
distinct values, but every call where more elements tie at its threshold than its spare
capacity holds, as in heavily quantized gradients).
Both rank elements by :func:`magnitude_keys`, integers that order like |x| under the rule.
The host selectors depart from the rule in two corners that the device path keeps to: they
rank NaN level with ±inf (the smaller index first), and :func:`threshold_topk` and
:func:`dgc_select` take x's NaNs as candidates only when their sample drew a NaN: otherwise
they leave every NaN out (|NaN| ≥ threshold is false).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from gradwire.check import check_fraction, is_int
from gradwire.compress.base import generator
from gradwire.dtypes import FLOATS
from gradwire.errors import GradwireError
from gradwire.syncfree import on_host

SELECTORS = ("exact", "threshold")
SAMPLE = 0.01
MIN_SAMPLE = 4096
# Slack of the sampled threshold in standard deviations of the sampled count (about Poisson, so
# sd = sqrt(expected)): at 4 sd a second full pass is rare (~1 call in 10^4) and the candidates
# stay within k·(1 + 4/sqrt(expected)) + O(1), e.g. 1.27k at 25 M elements, density 0.001.
MARGIN_SD = 4.0
# The device path's candidate capacity, in standard deviations of the candidate count above
# its expected value: at 6 sd more candidates than fit come about once in 10⁷ calls or rarer.
CAPACITY_SD = 6.0
THRESHOLD_PASSES = 2
TIE_CHUNK = 2**20
SORT_CANDIDATES = 2**16  # on a GPU, candidates kept by one stable sort; more by the exact rule
NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def _kth_largest(mag: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest of ``mag`` (0 < k < n), NaN above everything. numpy's partition
    where k is a large share of n (a merge keeps k of at most 2k: 0.34 against torch.topk's
    0.45 ms at 50 000 fp32 here); torch.topk otherwise (faster here when k ≪ n)."""
    n = mag.numel()
    if mag.device.type == "cpu" and mag.dtype in NUMPY_DTYPES[:2] and 8 * k >= n:
        # detached: numpy refuses a tensor that requires grad (a parameter's own values)
        top = np.partition(mag.detach().numpy(), n - k)[n - k :]  # NaNs sort last: the top
        return torch.from_numpy(top.min(keepdims=True))[0]
    return torch.topk(mag, k, sorted=False).values.min()  # min: NaN if a NaN is in the top


def largest(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the k largest of ``mag`` (≥ 0 or NaN), ties to the smaller index.

    One torch.topk for the k-th largest value t, then one compare (≥ t); only when more
    than one element equals t, everything above t and the first tied elements. No sort.
    """
    n = mag.numel()
    keep = torch.zeros(n, dtype=torch.bool, device=mag.device)
    if k >= n:
        return keep.fill_(True)
    if k <= 0:
        return keep
    t = _kth_largest(mag, k)
    if bool(torch.isnan(t)):  # NaN ranks above +inf, as in torch.topk
        mag = torch.nan_to_num(mag, nan=float("inf"), posinf=float("inf"))
        t = _kth_largest(mag, k)
    torch.ge(mag, t, out=keep)
    if int(keep.sum()) == k:  # t itself is the only element equal to t: the usual case
        return keep
    torch.gt(mag, t, out=keep)
    need = k - int(keep.sum())
    # The first ``need`` ties, found a chunk at a time: when t is 0 in a mostly-zero gradient
    # nearly every element ties, and one nonzero over all of them would list them all.
    for start in range(0, n, TIE_CHUNK):
        if need <= 0:
            break
        tied = torch.nonzero(mag[start : start + TIE_CHUNK] == t).squeeze(1)[:need]
        keep[tied + start] = True
        need -= tied.numel()
    return keep


def _untied_topk(mag: torch.Tensor, k: int) -> torch.Tensor | None:
    """torch.topk's k positions (in its order) when the k-th and (k+1)-th largest differ and
    the k-th is no NaN, so that no tie is left to break (the usual case); else None. One
    top-k of k + 1, the two smallest of those, one host sync for the check: no pass over
    ``mag``, which the full rule (:func:`largest`) makes twice."""
    if not 0 < k < mag.numel():
        return None
    values, idx = torch.topk(mag, k + 1, sorted=False)
    low = torch.topk(values, 2, largest=False)  # the (k+1)-th and the k-th largest
    last, kth = low.values[0], low.values[1]
    if bool(torch.isnan(kth) | (kth == last)):
        return None
    keep = idx.clone()
    keep[low.indices[0]] = idx[k]  # the (k+1)-th's slot takes the last one's, then cut
    return keep[:k]


def _top_positions(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Positions (int64) of the min(k, n) largest of ``mag``, ties to the smaller position:
    torch.topk's own answer where it has no tie to break, else :func:`largest` (ascending).
    On the CPU with k a large share of n, :func:`largest` at once (numpy's partition is the
    faster there)."""
    if not (mag.device.type == "cpu" and 8 * k >= mag.numel()):
        fast = _untied_topk(mag, k)
        if fast is not None:
            return fast
    return torch.nonzero(largest(mag, k)).squeeze(1)


def exact_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64) of the min(k, n) largest |x|, ties to the smaller index."""
    return _top_positions(x.detach().abs(), k)


def _sample_abs(x: torch.Tensor, size: int, g: torch.Generator) -> torch.Tensor:
    return x[torch.randint(x.numel(), (size,), generator=g, device=x.device)].abs()


def _sampled_kth(v: torch.Tensor, j: int) -> float:
    """The j-th largest of the sampled magnitudes ``v``, a NaN counted as +inf.

    A NaN drawn ranks in the top j (NaN is the largest), but min() over them would return it,
    and no element compares ≥ NaN: the pass would find no candidate at all (and DGC would
    send nothing). As +inf the threshold is the host rule's (NaN level with inf); the NaNs
    themselves come in through :func:`_candidates`. A Python float, not a 0-d tensor: the
    compares below run ~1.5x faster with a scalar (measured at 25 M fp32). The value came
    from x, so it is exact in x's dtype."""
    top = torch.topk(v, j, sorted=False).values
    return float(top.nan_to_num(nan=math.inf, posinf=math.inf).min())


def _candidates(x: torch.Tensor, threshold: float, nan: bool = False) -> torch.Tensor:
    """Indices (ascending) of every |x| ≥ threshold, and of every NaN where ``nan`` (the
    sample drew one, so the rule would take it). Two compares on x instead of one on x.abs()
    (a fresh n-element tensor). On the CPU numpy does the pass: torch's compares into a bool
    tensor and its nonzero were several times slower here (benchmarks/results:
    compress_speed/latest.json for 25 M, train_demo/latest.json's compress column at
    1.13 M)."""
    if x.device.type == "cpu" and x.dtype in NUMPY_DTYPES:
        a = x.detach().numpy()
        if nan:  # a NaN compares false both ways, so it is "not below the threshold"
            return torch.from_numpy(np.flatnonzero(~((a < threshold) & (a > -threshold))))
        return torch.from_numpy(np.flatnonzero((a >= threshold) | (a <= -threshold)))
    if nan:
        return torch.nonzero(~((x < threshold) & (x > -threshold))).squeeze(1)
    return torch.nonzero((x >= threshold) | (x <= -threshold)).squeeze(1)


def _keep_largest(x: torch.Tensor, cand: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest |x| among the ascending indices ``cand``, ties to the smaller index.
    On a GPU the sampled threshold's few candidates go through one stable sort of their
    magnitudes, which keeps tied ones in index order (NaN first) with no host sync;
    otherwise the exact selector on them (their order is x's): a sort of many costs more,
    and on the CPU numpy's partition is faster than a sort of any size."""
    if cand.numel() <= k:
        return cand
    mag = x[cand].abs()
    if mag.device.type != "cpu" and cand.numel() <= SORT_CANDIDATES:
        return cand[torch.sort(mag, descending=True, stable=True).indices[:k]]
    return cand[_top_positions(mag, k)]


def _nonzeros_first(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest |x| when the sampled threshold is 0 (many exact zeros, as in embedding
    gradients): the largest nonzeros, topped up with the first zeros. Without this every
    element would be a candidate and the last step a torch.topk over all of x."""
    nz = torch.nonzero(x).squeeze(1)
    if nz.numel() >= k:
        return _keep_largest(x, nz, k)
    return torch.cat([nz, torch.nonzero(x == 0).squeeze(1)[: k - nz.numel()]])


def _sample_size(numel: int, sample: float, min_sample: int) -> int:
    return max(min_sample, math.ceil(sample * numel))


# A pass's verdict on its candidates: (the selection, or None to pass again; the next j).
Verdict = Callable[[torch.Tensor, int], tuple[torch.Tensor | None, int]]


def _threshold_passes(x: torch.Tensor, k: int, g: torch.Generator, sample: float,
                      min_sample: int, passes: int, first_j: Callable[[float], int],
                      verdict: Verdict,
                      give_up: Callable[[torch.Tensor | None], torch.Tensor]) -> torch.Tensor:
    """The sampled-threshold search both selectors share: draw s elements; threshold = the
    j-th largest |sample| (j = ``first_j(k·s/n)``); the candidates are every |x| ≥ threshold;
    ``verdict`` accepts them or says the next j. A zero threshold means mostly zeros
    (:func:`_nonzeros_first`). After ``passes`` passes, ``give_up(last candidates)``."""
    x = x.detach()  # indices only: no graph, and numpy refuses a tensor that requires grad
    n = x.numel()
    s = _sample_size(n, sample, min_sample)
    # k < 0: none, as exact_topk gives (not the square root of a negative expected count);
    # 2s >= n: a sample this large costs as much as torch.topk
    if k <= 0 or k >= n or 2 * s >= n:
        return exact_topk(x, k)
    v = _sample_abs(x, s, g)
    nan = bool(torch.isnan(v).any())  # a NaN drawn: x's NaNs are candidates too
    j, cand = max(1, min(s, first_j(k * s / n))), None
    for _ in range(passes):
        threshold = _sampled_kth(v, j)
        if threshold == 0:
            return _nonzeros_first(x, k)
        cand = _candidates(x, threshold, nan)
        chosen, nxt = verdict(cand, j)
        if chosen is not None:
            return chosen
        if j == s:
            break
        j = min(s, nxt)
    return give_up(cand)


def _with_margin(expected: float) -> int:
    """The sampled rank j of the threshold: ``MARGIN_SD`` standard deviations above the
    expected count ``expected`` of the sample in the top k."""
    return math.ceil(expected + MARGIN_SD * (math.sqrt(expected) + 1))


def threshold_topk(x: torch.Tensor, k: int, g: torch.Generator, sample: float = SAMPLE,
                   min_sample: int = MIN_SAMPLE) -> torch.Tensor:
    """Indices (int64) of exactly the k largest |x|, found with about one pass.

    1. Draw s = max(min_sample, sample·n) elements of x; their j-th largest |x|, with j a few
       standard deviations above the expected k·s/n, is a threshold just below the k-th.
    2. One pass: the candidates are every element with |x| ≥ threshold.
    3. If there are ≥ k, keep the top k of the candidates (ties to the smaller index).
       If fewer, lower the threshold (j ×4) and pass again; after ``THRESHOLD_PASSES`` fall
       back to the exact selector on all of x.

    The result is always the exact selector's; the sample only decides the speed.
    Cost: one compare pass and one nonzero over n, plus a top-k of ~k candidates.
    """
    def verdict(cand: torch.Tensor, j: int) -> tuple[torch.Tensor | None, int]:
        return (_keep_largest(x, cand, k) if cand.numel() >= k else None), 4 * j

    return _threshold_passes(x, k, g, sample, min_sample, THRESHOLD_PASSES, _with_margin,
                             verdict, lambda _: exact_topk(x, k))


def dgc_select(x: torch.Tensor, k: int, capacity: int, g: torch.Generator, sample: float,
               passes: int, min_sample: int = MIN_SAMPLE) -> torch.Tensor:
    """DGC's selection: indices (int64) of the c largest |x|, k²/capacity ≤ c ≤
    capacity unless the passes run out (then fewer), with capacity = ⌈slack·k⌉ (so c is
    about k/slack at least: 10 for k = 13 at slack 1.25, where k/slack is 10.4).

    Threshold = the ⌈k·s/n⌉-th largest |x| of a sample of s; one pass selects |x| ≥ threshold.
    More than ``capacity`` selected: keep the top k of them (no further pass). Fewer than
    k²/capacity: rescale the sampled rank by k/count and pass again, at most ``passes`` in all.
    """
    def verdict(cand: torch.Tensor, j: int) -> tuple[torch.Tensor | None, int]:
        c = cand.numel()
        if c > capacity:
            return _keep_largest(x, cand, k), j
        if c * capacity >= k * k:
            return cand, j
        return None, math.ceil(j * k / max(c, 1))

    return _threshold_passes(x, k, g, sample, min_sample, passes, math.ceil, verdict,
                             lambda cand: cand)


# The device path -------------------------------------------------------------------------

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}
# The key of every NaN: one above +inf's bit pattern, the lowest NaN pattern.
_NAN_KEY = {dt: int(torch.tensor(float("inf"), dtype=dt).view(bits)) + 1
            for dt, bits in _BITS.items()}


def _abs_bits(x: torch.Tensor) -> torch.Tensor:
    """|x| as integers of x's width: x's bits with the sign bit cleared. Non-negative floats
    order like their bits, -0.0 and 0.0 both become 0, and every NaN (any sign, any payload)
    lies above +inf, though NaNs of different payloads differ among themselves."""
    if x.dtype not in _BITS:
        raise GradwireError(f"select: no device path for {x.dtype}; floats are "
                            f"{', '.join(str(d) for d in _BITS)}")
    bits = _BITS[x.dtype]
    return x.detach().view(bits) & torch.iinfo(bits).max


def magnitude_keys(x: torch.Tensor) -> torch.Tensor:
    """Integers (x's width) that order like |x| under the tie rule: equal for equal |x|
    (-0.0 and 0.0 included), every NaN one key above +inf. A new tensor, one pass."""
    return _abs_bits(x).clamp_(max=_NAN_KEY[x.dtype])


def device_exact(x: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending indices (int64) of exactly the k largest |x| (0 < k < n), ties to the
    smaller index, with no host sync and no data-dependent shape.

    t = the k-th largest key (one torch.topk in x's width: 2 bytes for fp16, 4 for fp32);
    the elements above t, then the first ``k − count`` tied with t (a running count of the
    ties), compacted with ``nonzero_static`` into exactly k slots. About ten elementwise passes
    over n (most over 1-byte masks) plus the top-k, whatever the dtype (fp64 included) and
    n: no composite (key, index) sort key, which would not fit 64 bits for fp64."""
    n = x.numel()
    bits = _abs_bits(x)  # raw NaN payloads: the two compares below treat all NaNs alike
    nan_key = _NAN_KEY[x.dtype]
    t = torch.topk(bits, k, sorted=False).values.min().clamp(max=nan_key)
    top = torch.where(t == nan_key, torch.iinfo(bits.dtype).max, t)  # NaN: nothing above
    above = bits > top
    tied = (bits >= t).logical_xor_(above)  # == t, or any NaN when t is NaN's key
    need = k - above.sum()
    count = tied.cumsum(0, dtype=torch.int32 if n < 2**31 else torch.int64)
    keep = above.logical_or_(tied.logical_and_(count <= need))  # exactly k
    return torch.nonzero_static(keep, size=k).squeeze(1)


def device_capacity(n: int, k: int, s: int, j: int) -> int:
    """How many candidates :func:`device_threshold` keeps when its threshold is the j-th
    largest of s sampled |x| out of n: ``CAPACITY_SD`` standard deviations above the expected
    count n·j/s (the count is about n/s · Gamma(j)); at least k, at most n."""
    return min(n, max(k, math.ceil(n / s * (j + CAPACITY_SD * (math.sqrt(j) + 1)))))


def device_threshold(x: torch.Tensor, k: int, g: torch.Generator, sample: float = SAMPLE,
                     min_sample: int = MIN_SAMPLE) -> torch.Tensor:
    """Ascending indices (int64) of k distinct elements of x (0 < k < n): the k largest |x|
    under the tie rule unless the sample misses. No host sync, about three passes over x.

    1. The host's sample and threshold (:func:`threshold_topk`'s first pass: the same draws
       from ``g``, the same j) as a 0-d key t on the device, raised to the smallest nonzero
       key: a zero threshold (mostly-zero gradients) makes the nonzeros the candidates.
    2. One pass: the candidates, every key ≥ t, the first C by index compacted into C slots
       (``nonzero_static``; C = :func:`device_capacity`, ~1.2–1.7 k at densities 10⁻³–10⁻²).
    3. One stable sort of the C candidates' keys and of x[:k]'s keys below t: the first k.

    The set is exact whenever the candidate count lands in [k, C], and also when it is below k
    and the threshold was zero (the rule then takes the first zeros, which x[:k] holds). Misses:
    fewer than k candidates (the sample's j-th largest lies above the k-th largest of x: at
    most a few calls in 10⁵, as often as the host's second pass) gives every candidate, then the
    largest non-candidates among x[:k]; more than C (below once in 10⁷ calls for distinct
    values; every call where a tie group at t is larger than C − k, as in heavily quantized
    gradients) gives the k largest of the first C candidates by index. Either way k distinct
    valid indices, so a caller that zeroes acc there and sends acc's values conserves mass."""
    n = x.numel()
    s = _sample_size(n, sample, min_sample)
    if 2 * s >= n:  # as on the host: a sample this large costs as much as the exact top k
        return device_exact(x, k)
    bits = _abs_bits(x)
    drawn = bits[torch.randint(n, (s,), generator=g, device=x.device)]
    j = max(1, min(s, _with_margin(k * s / n)))
    t = torch.topk(drawn, j, sorted=False).values.min().clamp(min=1, max=_NAN_KEY[x.dtype])
    cap = device_capacity(n, k, s, j)
    cand = torch.nonzero_static(bits >= t, size=cap, fill_value=n).squeeze(1)  # then n: none
    cand_keys = torch.where(cand < n, magnitude_keys(x[cand.clamp(max=n - 1)]), -1)
    head = magnitude_keys(x[:k])  # when fewer than k candidates: the rest comes from here
    head_keys = torch.where(head < t, head, -1)  # x[:k] holds ≥ k − count non-candidates
    first = torch.sort(torch.cat([cand_keys, head_keys]), descending=True, stable=True)
    return torch.cat([cand, torch.arange(k, device=x.device)])[first.indices[:k]].sort().values


def select(acc: torch.Tensor, k: int, selector: str = "exact",
           g: torch.Generator | None = None, sample: float = SAMPLE) -> torch.Tensor:
    """Indices (int64) of the min(k, n) largest |acc|, by ``selector`` ("exact" or
    "threshold"; both give the same set). ``g`` draws the threshold's sample (default: a
    generator seeded 0, the same on every rank and call).

    On the device path (:func:`gradwire.syncfree.on_host` false): exactly min(k, n) distinct
    indices in ascending order, with no host sync (:func:`device_exact`,
    :func:`device_threshold`, whose set is exact unless its sample misses, or a tie group at
    its threshold overflows its capacity: see there)."""
    if selector not in SELECTORS:  # a typo must not quietly run another selector
        raise GradwireError(f"select: selector must be one of {', '.join(map(repr, SELECTORS))}, "
                            f"got {selector!r}")
    if not (isinstance(acc, torch.Tensor) and acc.dim() == 1 and acc.dtype in FLOATS):
        got = (f"{tuple(acc.shape)} {acc.dtype}" if isinstance(acc, torch.Tensor)
               else type(acc).__name__)
        raise GradwireError(f"select: acc must be a 1-D float tensor (fp16, bf16, fp32, fp64), "
                            f"got {got}")
    if not is_int(k, 0):
        raise GradwireError(f"select: k must be an integer >= 0, got {k!r}")
    if selector == "threshold":
        check_fraction("select: sample", sample)
        if g is not None and not isinstance(g, torch.Generator):
            raise GradwireError(f"select: g must be a torch.Generator or None, got "
                                f"{type(g).__name__}")
    n = acc.numel()
    k = min(int(k), n)  # int: a numpy integer's products wrap (np.uint8(4) · 4096 samples)
    if k == n:
        return torch.arange(n, device=acc.device)
    if not on_host(acc):
        if k <= 0:
            return torch.zeros(0, dtype=torch.int64, device=acc.device)
        if selector == "threshold":
            return device_threshold(
                acc, k, g if g is not None else generator(0, 0, acc.device), sample)
        return device_exact(acc, k)
    if selector == "threshold":
        return threshold_topk(acc, k, g if g is not None else generator(0, 0, acc.device),
                              sample)
    return exact_topk(acc, k)
