"""Structure of every registered schedule: correct on tokens for P = 1..17 and odd sizes, and
its derived cost equal to the closed forms of Thakur, Rabenseifner & Gropp, "Optimization of
Collective Communication Operations in MPICH" (2005), and of the algorithms' docstrings."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.check import ScheduleError, check
from gradwire.schedules.cost import CostParams, back_to_back, cost, traffic
from gradwire.schedules.ir import Transfer, build

SIZES = [0, 1, 2, 3, 5, 7, 13, 16, 24, 32, 64, 1000]
ALGOS = [pytest.param(a, id=f"{a.collective}/{a.name}") for a in registry.ALGORITHMS]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("p", range(1, 18))
def test_symbolically_correct(algo, p):
    for n in SIZES:
        for root in sorted({0, p - 1, p // 2}) if algo.rooted else [0]:
            check(registry.schedule(algo.collective, algo.name, p, n, root))


@pytest.mark.parametrize("algo", ALGOS)
@given(p=st.integers(1, 17), n=st.integers(0, 300), root=st.integers(0, 16))
@settings(max_examples=25, deadline=None)
def test_symbolic_property(algo, p, n, root):
    check(registry.schedule(algo.collective, algo.name, p, n, root % p if algo.rooted else 0))


def test_checker_names_the_wrong_rank_and_element():
    # A "ring" that forgets its last allgather step.
    good = registry.schedule("allreduce", "ring", 4, 8)
    broken = build("broken", "allreduce", 4, 8, [s.transfers for s in good.steps[:-1]])
    with pytest.raises(ScheduleError, match=r"rank \d element \d+ holds \{.*\} but should hold "
                                            r"\{0, 1, 2, 3\}"):
        check(broken)
    with pytest.raises(ScheduleError, match="bad rank pair"):
        check(build("x", "allreduce", 2, 4, [[Transfer(0, 0, 0, 4, "sum")]]))


# Closed forms (Thakur, Rabenseifner & Gropp 2005), n bytes, for counts divisible by the pieces
# involved.
A, B, G = 1e-4, 8e-9, 1e-9
P = CostParams(A, B, G)


def lg(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


FORMULAS = {
    ("allreduce", "ring"): lambda p, n: 2 * (p - 1) * A + 2 * (p - 1) / p * n * B
    + (p - 1) / p * n * G,
    ("allgather", "ring"): lambda p, n: (p - 1) * A + (p - 1) / p * n * B,
    ("reducescatter", "ring"): lambda p, n: (p - 1) * A + (p - 1) / p * n * (B + G),
    ("allgather", "bruck"): lambda p, n: bruck_messages(p) * A + (p - 1) / p * n * B,
}


def bruck_messages(p: int) -> int:
    """Bruck's step at distance d sends min(d, p − d) blocks: one message, or two when the run
    of blocks may wrap past the buffer's end (more than one block)."""
    return sum(1 if min(d, p - d) == 1 else 2 for d in (1 << s for s in range(lg(p))))


@pytest.mark.parametrize("key", sorted(FORMULAS))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 32])
def test_cost_equals_closed_form(key, p):
    for elems in (p * 5040, p * 65536):
        s = registry.schedule(key[0], key[1], p, elems)
        assert cost(s, P, 4) == pytest.approx(FORMULAS[key](p, elems * 4), rel=1e-12)


@pytest.mark.parametrize("p", [2, 3, 4, 8, 13])
def test_ring_pattern_is_a_ring_and_sends_2n_p_minus_1_over_p(p):
    n = p * 1000
    s = registry.schedule("allreduce", "ring", p, n)
    tr = traffic(s, 4)
    pairs = {(i, j) for i in range(p) for j in range(p) if tr.bytes_sent[i, j]}
    assert pairs == {(r, (r + 1) % p) for r in range(p)}
    assert (tr.bytes_sent.sum(1) == 2 * 4 * n * (p - 1) // p).all()
    assert (tr.messages_sent.sum(1) == 2 * (p - 1)).all()


@pytest.mark.parametrize("p", [2, 3, 5, 6, 7, 12, 17, 48, 100])
def test_bruck_takes_ceil_lg_p_steps_to_rank_minus_2_to_the_s(p):
    n = p * 1000
    s = registry.schedule("allgather", "bruck", p, n)
    assert len(s.steps) == lg(p)
    for i, step in enumerate(s.steps):
        assert {(t.src, t.dst) for t in step.transfers} == {(r, (r - 2**i) % p) for r in range(p)}
    tr = traffic(s, 4)
    assert (tr.bytes_sent.sum(1) == 4 * n * (p - 1) // p).all()
    assert (tr.bytes_received.sum(1) == 4 * n * (p - 1) // p).all()
    assert int(tr.messages_sent.sum(1).max()) <= 2 * lg(p) - 1


def test_bruck_beats_the_butterflys_fold_at_p_not_a_power_of_two():
    for p in (3, 5, 6, 12, 48):
        n = p * 65536
        bruck, rd = (cost(registry.schedule("allgather", a, p, n), P, 4) for a in ("bruck", "rd"))
        assert bruck < rd, (p, bruck, rd)


def test_unknown_algorithm_suggests():
    with pytest.raises(GradwireError, match="did you mean 'ring'"):
        registry.get("allreduce", "rnig")
    with pytest.raises(GradwireError, match="unknown collective"):
        registry.get("alltoall", "ring")


@pytest.mark.parametrize("p,count,match", [
    (4, 10.5, "element count must be an integer >= 0, got 10.5"),
    (4, "10", "element count must be an integer >= 0, got '10'"),
    (4, -1, "element count must be an integer >= 0, got -1"),
    (4.0, 10, "world size must be from 1 to 4096, got 4.0"),
    (True, 10, "world size must be from 1 to 4096, got True"),
])
def test_world_and_count_must_be_integers(p, count, match):
    """A float count cut blocks past the buffer's end (10.5 over 4 ranks made 11 elements),
    a float world size was a TypeError: both are one line, from schedule() and table()."""
    for make in (registry.schedule, registry.table):
        with pytest.raises(GradwireError, match=match) as e:
            make("allreduce", "ring", p, count)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("algo", [("allreduce", "ring"), ("broadcast", "lp"),
                                  ("allreduce", "dbtree"), ("allgather", "bruck")])
@pytest.mark.parametrize("itemsize", ["4", 0, -4, 2.0, True, None])
def test_itemsize_must_be_a_positive_integer(algo, itemsize):
    """Every builder is given ``itemsize`` (the API passes the tensor's, which a caller may
    override): a string was a TypeError inside the builder, 0 went unnoticed."""
    with pytest.raises(GradwireError, match=f"parameter itemsize={itemsize!r}: expected an "
                                            "integer >= 1"):
        registry.schedule(*algo, 4, 100, itemsize=itemsize)


def test_ring_cuts_large_chunks_into_sub_chunks_unless_told():
    from gradwire.schedules.ring import MAX_PIPELINE, SUBCHUNK_BYTES

    def msgs(p, n, **kw):
        return int(traffic(registry.schedule("allreduce", "ring", p, n, **kw), 4)
                   .messages_sent[0].sum())

    small = 8 * SUBCHUNK_BYTES // 4 - 8  # 8 chunks each just under one sub-chunk at P=8
    assert msgs(8, small) == 14
    assert msgs(8, 8 * 3 * SUBCHUNK_BYTES // 4) == 14 * 3
    assert msgs(8, 8 * 64 * SUBCHUNK_BYTES // 4) == 14 * MAX_PIPELINE
    assert msgs(8, 8 * 64 * SUBCHUNK_BYTES // 4, pipeline=1) == 14
    # float64 chunks are twice the bytes of float32 ones: twice the sub-chunks.
    n = 8 * 2 * SUBCHUNK_BYTES // 8
    assert int(traffic(registry.schedule("allreduce", "ring", 8, n, itemsize=8), 8)
               .messages_sent[0].sum()) == 14 * 2
    with pytest.raises(GradwireError, match="pipeline must be an int >= 1"):
        registry.schedule("allreduce", "ring", 4, 100, pipeline=0)


# Links shaped by a token bucket (cost.py's docstring) ----------------------------------------
BUCKET_PARAMS = CostParams(2e-4, 8e-9, 1e-10)


@settings(max_examples=80, deadline=None)
@given(algo=st.sampled_from(registry.ALGORITHMS), p=st.integers(1, 9),
       count=st.integers(0, 5000), burst=st.floats(0, 1e5), start=st.floats(0, 1e5))
def test_a_token_bucket_never_beats_the_rate_nor_costs_more_than_a_plain_link(
        algo, p, count, burst, start):
    s = registry.schedule(algo.collective, algo.name, p, count)
    a, b, g = BUCKET_PARAMS.alpha, BUCKET_PARAMS.beta, BUCKET_PARAMS.gamma
    plain = cost(s, BUCKET_PARAMS, 4)
    shaped = cost(s, CostParams(a, b, g, burst=burst, start_credit=start), 4)
    assert shaped <= plain * (1 + 1e-12)
    # in the long run a link passes at most its credit at the start plus what it earns
    t = traffic(s, 4)
    busiest = max(t.bytes_sent.sum(axis=1).max(), t.bytes_received.sum(axis=1).max())
    assert shaped >= (busiest - min(start, burst)) * b * (1 - 1e-12)
    # α and γ are not the link's: no bucket hides them
    floor = sum(max(a * n for n in _messages(step, p)) for step in s.steps)
    assert shaped >= floor * (1 - 1e-12)


def _messages(step, p: int) -> list[int]:
    out, inn = [0] * p, [0] * p
    for t in step.transfers:
        out[t.src] += 1
        inn[t.dst] += 1
    return [max(o, i) for o, i in zip(out, inn, strict=True)]


@pytest.mark.parametrize("algo", ALGOS)
def test_no_bucket_is_the_plain_step_sum_whatever_the_start_credit(algo):
    s = registry.schedule(algo.collective, algo.name, 5, 1003)
    a, b, g = BUCKET_PARAMS.alpha, BUCKET_PARAMS.beta, BUCKET_PARAMS.gamma
    assert cost(s, CostParams(a, b, g, burst=0, start_credit=1e9), 4) == cost(
        s, BUCKET_PARAMS, 4)


@settings(max_examples=60, deadline=None)
@given(algo=st.sampled_from(registry.ALGORITHMS), p=st.integers(1, 9),
       count=st.integers(0, 5000), burst=st.floats(0, 1e5))
def test_calls_back_to_back_cost_between_a_full_and_an_empty_bucket(algo, p, count, burst):
    """Credit carried from one call into the next makes a call no slower than one that starts
    with none, and no faster than one whose every link starts full."""
    s = registry.schedule(algo.collective, algo.name, p, count)
    a, b, g = BUCKET_PARAMS.alpha, BUCKET_PARAMS.beta, BUCKET_PARAMS.gamma
    shaped = CostParams(a, b, g, burst=burst)
    steady = back_to_back([(s, 4)], shaped)
    assert steady <= cost(s, shaped, 4) * (1 + 1e-12)
    full = cost(s, CostParams(a, b, g, burst=burst, start_credit=burst), 4)
    assert steady >= full * (1 - 1e-12)


def test_back_to_back_is_the_plain_sum_without_a_bucket_and_carries_credit_with_one():
    a, b = 2e-4, 8e-9
    header = registry.schedule("allgather", "rd", 4, 4 * 168)
    data = registry.schedule("broadcast", "lp", 4, 2**18, itemsize=4, alpha=a, beta=b)
    plain = CostParams(a, b, burst=0)
    assert back_to_back([(header, 1), (data, 4)], plain) == cost(header, plain, 1) + cost(
        data, plain, 4)
    # the chain's root sends its last block early and earns while the chain drains: the next
    # call's first blocks leave on that credit
    shaped = CostParams(a, b, burst=500_000)
    cold = cost(header, shaped, 1) + cost(data, shaped, 4)
    assert back_to_back([(header, 1), (data, 4)], shaped) < cold * 0.95
    assert back_to_back([], shaped) == 0.0


def test_a_bucket_hides_the_linear_pipelines_fill_and_latency():
    # The emulated 1 Gbit/s cluster (α 372 µs, β 8.34 ns/B, a 500 kB bucket), 64 MiB, P = 8:
    # the plain model charges LP broadcast 1.13 n·β, the bucket 1.06 (measured: 1.07, 0.597 s)
    a, b, n = 372e-6, 8.34e-9, 64 * 2**20
    s = registry.schedule("broadcast", "lp", 8, n // 4, itemsize=4, alpha=a, beta=b)
    assert cost(s, CostParams(a, b), 4) / (n * b) == pytest.approx(1.131, abs=0.001)
    assert cost(s, CostParams(a, b, burst=500_000), 4) / (n * b) == pytest.approx(1.058, abs=0.001)
    # with a full bucket at the start, one block passes before the first α is paid
    one = registry.schedule("broadcast", "lp", 2, 1000, block=1000)
    assert cost(one, CostParams(a, b, burst=4000, start_credit=4000), 4) == pytest.approx(a)



def test_an_uncached_table_keeps_no_schedule():
    """table(cached=False) is built afresh and not kept, whether or not the algorithm has a
    table builder of its own (binomial has none: its schedule is built, then dropped)."""
    before = registry._cached.cache_info()
    registry.table("broadcast", "binomial", 5, 4321, cached=False)
    assert registry._cached.cache_info() == before
    registry.table("broadcast", "binomial", 5, 4321)  # cached: the schedule is kept
    assert registry._cached.cache_info().misses == before.misses + 1
