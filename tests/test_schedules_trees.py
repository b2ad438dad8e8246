"""Binomial trees, recursive doubling, Rabenseifner's halving-doubling and the master allreduce:
their derived cost equals the closed forms of their docstrings (after Thakur et al. 2005 and
Chan et al. 2007, exact for every p), and their communication has the pattern the algorithm
names. Symbolic correctness for P = 1..17 comes from the registry sweep in test_schedules.py."""
import math

import numpy as np
import pytest

from gradwire.schedules import registry
from gradwire.schedules.cost import CostParams, cost, traffic

A, B, G = 1e-4, 8e-9, 1e-9
P = CostParams(A, B, G)


def lg(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def core(p: int) -> int:
    """p' = 2^⌊lg p⌋, the ranks that run the power-of-two algorithm."""
    return 1 << (p.bit_length() - 1)


def folded_blocks(p: int) -> int:
    """S = Σ_{k<⌊lg p⌋} min(2^k, p − p'): folded blocks carried by the largest group."""
    return sum(min(1 << k, p - core(p)) for k in range(lg(core(p))))


# (collective, algo) -> (closed form for p a power of two, or for every p when the second is
# None; closed form for other p), n in bytes.
FORMULAS = {
    ("broadcast", "binomial"): (lambda p, n: lg(p) * (A + n * B), None),
    ("reduce", "binomial"): (lambda p, n: lg(p) * (A + n * B + n * G), None),
    ("allreduce", "tree"): (lambda p, n: 2 * lg(p) * (A + n * B) + lg(p) * n * G, None),
    ("allreduce", "master"): (lambda p, n: 2 * (p - 1) * (A + n * B) + (p - 1) * n * G, None),
    ("allreduce", "rd"): (
        lambda p, n: lg(p) * (A + n * B + n * G),
        lambda p, n: (lg(core(p)) + 2) * (A + n * B) + (lg(core(p)) + 1) * n * G),
    ("allgather", "rd"): (
        lambda p, n: lg(p) * A + (p - 1) / p * n * B,
        lambda p, n: (lg(core(p)) + 2) * A + (1 + (core(p) + folded_blocks(p)) / p) * n * B),
    # Thakur et al. (2005) give (2⌊lg p⌋+2)α + (2(p−1)/p + 2)nβ + (1+(p−1)/p)nγ for p not a power
    # of two, Thakur's approximation; the exact form has p' = 2^⌊lg p⌋ where it has p.
    ("allreduce", "rhd"): (
        lambda p, n: 2 * lg(p) * A + 2 * (p - 1) / p * n * B + (p - 1) / p * n * G,
        lambda p, n: (2 * lg(core(p)) + 2) * A + (2 * (core(p) - 1) / core(p) + 2) * n * B
        + (1 + (core(p) - 1) / core(p)) * n * G),
    ("reducescatter", "rhd"): (
        lambda p, n: lg(p) * A + (p - 1) / p * n * (B + G),
        lambda p, n: (lg(core(p)) + 2) * A + (1 + (core(p) + folded_blocks(p)) / p) * n * B
        + (1 + (core(p) - 1 + folded_blocks(p)) / p) * n * G),
}


@pytest.mark.parametrize("key", sorted(FORMULAS))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 17, 32])
def test_cost_equals_closed_form(key, p):
    pow2_form, other_form = FORMULAS[key]
    form = other_form if other_form is not None and p != core(p) else pow2_form
    # rhd allreduce needs n divisible by p' only; the others by p.
    unit = core(p) if key == ("allreduce", "rhd") else p
    algo = registry.get(*key)
    for elems in (unit * 5040, unit * 65536):
        for root in sorted({0, p - 1}) if algo.rooted else [0]:
            s = registry.schedule(key[0], key[1], p, elems, root)
            assert cost(s, P, 4) == pytest.approx(form(p, elems * 4), rel=1e-12)


@pytest.mark.parametrize("key", [("broadcast", "binomial"), ("reduce", "binomial"),
                                 ("allreduce", "tree")])
@pytest.mark.parametrize("p", range(1, 18))
def test_binomial_moves_one_whole_buffer_per_rank_per_step(key, p):
    n, passes = 100, 2 if key[0] == "allreduce" else 1  # tree = reduce + broadcast
    for root in sorted({0, p // 2, p - 1}) if passes == 1 else [0]:
        s = registry.schedule(*key, p, n, root)
        assert len(s.steps) == lg(p) * passes
        for step in s.steps:
            srcs = [t.src for t in step.transfers]
            dsts = [t.dst for t in step.transfers]
            assert len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts)
            assert all(t.count == n for t in step.transfers)
        assert sum(len(step.transfers) for step in s.steps) == (p - 1) * passes


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_rd_allreduce_is_a_hypercube_of_whole_buffers(p):
    n = 1000
    tr = traffic(registry.schedule("allreduce", "rd", p, n), 4)
    pairs = {(i, j) for i in range(p) for j in range(p) if tr.bytes_sent[i, j]}
    assert pairs == {(r, r ^ (1 << k)) for r in range(p) for k in range(lg(p))}
    assert (tr.messages_sent.sum(1) == lg(p)).all()
    assert (tr.bytes_sent.sum(1) == lg(p) * 4 * n).all()


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 16])
def test_rhd_allreduce_sends_like_the_ring_in_2_lg_p_messages(p):
    q = core(p)
    n = q * 1000
    tr = traffic(registry.schedule("allreduce", "rhd", p, n), 4)
    sent, msgs = tr.bytes_sent.sum(1), tr.messages_sent.sum(1)
    folded = list(range(1, 2 * (p - q), 2))  # each sends its buffer in and gets the sum back
    assert (sent[folded] == 4 * n).all() and (msgs[folded] == 1).all()
    assert (tr.bytes_received.sum(1)[folded] == 4 * n).all()
    for r in set(range(p)) - set(folded):
        unfold = r + 1 in folded  # the sum goes back to the folded partner: n more, 1 message
        assert sent[r] == 2 * 4 * n * (q - 1) // q + unfold * 4 * n
        assert msgs[r] == 2 * lg(q) + unfold


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_master_talks_only_to_rank_0(p):
    n = 64
    tr = traffic(registry.schedule("allreduce", "master", p, n), 4)
    want = np.zeros((p, p), dtype=np.int64)
    want[1:, 0] = want[0, 1:] = 4 * n
    assert (tr.bytes_sent == want).all()
    assert (tr.messages_sent == (want > 0)).all()
    assert (tr.bytes_reduced == np.eye(1, p, 0, dtype=np.int64)[0] * 4 * n * (p - 1)).all()
