"""Edges of the schedules package that the sweeps of test_schedules*.py do not reach: inputs
the registry must refuse in one line, a combine op a builder cannot honour, malformed
schedules the symbolic checker must name, and per-rank totals past float64's exact range."""

import pytest

from gradwire.check import MAX_BYTES
from gradwire.errors import GradwireError
from gradwire.schedules import registry
from gradwire.schedules.check import ScheduleError, check, expected_state, run_symbolic
from gradwire.schedules.cost import CostParams, traffic
from gradwire.schedules.ir import Schedule, Step, Transfer, build

# the algorithms whose builders take a combine op (the others sum): gTop-k's merge runs on
# allreduce's tree and butterfly, and on the binomial reduce the tree is made of
TAKES_OP = {a for a in registry.ALGORITHMS
            if (a.collective, a.name) in {("allreduce", "rd"), ("allreduce", "tree"),
                                          ("reduce", "binomial")}}
SUM_ONLY = [pytest.param(a, id=f"{a.collective}/{a.name}") for a in registry.ALGORITHMS
            if a not in TAKES_OP]


@pytest.mark.parametrize("algo", SUM_ONLY)
def test_a_combine_a_builder_cannot_run_is_refused(algo):
    """``op`` is given to every builder, and one without an ``op`` parameter sums: asked for
    gTop-k's merge, the ring (and every other sum-only builder) silently built a schedule that
    sums, so the executor would add packed (index, value) bytes. Refused in one line, naming
    the algorithms that do take op."""
    with pytest.raises(GradwireError, match=f"{algo.collective} {algo.name} combines by "
                                            r"sum only: op='gtopk'") as e:
        registry.schedule(algo.collective, algo.name, 4, 10, op="gtopk")
    assert "\n" not in str(e.value)
    takers = [b.name for b in registry.algorithms(algo.collective) if b in TAKES_OP]
    assert str(e.value).endswith(", ".join(takers) or f"no {algo.collective} algorithm does")
    with pytest.raises(GradwireError, match="combines by sum only"):
        registry.table(algo.collective, algo.name, 4, 10, op="gtopk")
    with pytest.raises(GradwireError, match=r"op=5 needs"):
        registry.schedule(algo.collective, algo.name, 4, 10, op=5)
    # the sum it does run is still accepted by name
    s = registry.schedule(algo.collective, algo.name, 4, 10, op="sum")
    assert {t.op for _, t in s.transfers()} <= {"sum", "copy"}
    # builders that take a combine still get it
    for collective, name in (("allreduce", "tree"), ("allreduce", "rd"), ("reduce", "binomial")):
        s = registry.schedule(collective, name, 4, 10, op="gtopk")
        assert {t.op for _, t in s.transfers() if t.reduces} == {"gtopk"}


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather"])
def test_an_empty_algorithm_name_is_not_the_default(collective):
    """Only None means "the default": an empty name (``--algo ':pipeline=2'``) ran the ring,
    labelled as asked."""
    with pytest.raises(GradwireError, match=f"unknown {collective} algorithm '': expected "
                                            "one of"):
        registry.get(collective, "")
    with pytest.raises(GradwireError, match="algorithm ''"):
        registry.schedule(collective, "", 4, 10)
    assert registry.get(collective).name == registry.DEFAULTS[collective]


@pytest.mark.parametrize("count", [MAX_BYTES + 1, 2**62, 10**30])
def test_an_element_count_past_any_buffer_is_one_line(count):
    """10**30 elements was an OverflowError from numpy (or from the cost model's int64
    counters); 2**62 built, and its table in bytes wrapped around int64."""
    for make in (registry.schedule, registry.table):
        with pytest.raises(GradwireError, match=f"element count must be at most {MAX_BYTES} "
                                                rf"\(2\*\*50\), got {count}") as e:
            make("allreduce", "ring", 4, count)
        assert "\n" not in str(e.value)
    assert registry.table("allreduce", "ring", 4, MAX_BYTES).count == MAX_BYTES


@pytest.mark.parametrize("collective,name,p", [("allreduce", "master", 12),
                                                ("allreduce", "ps", 12)])
def test_per_rank_totals_are_exact_past_two_to_the_53(collective, name, p):
    """Table.sent() and received() summed sizes in float64: rank 0 of a 12-rank master
    allreduce sends 11·(2**50 − 1) elements, which float64 rounds; traffic() counts them
    exactly."""
    n = 2**50 - 1
    t = registry.table(collective, name, p, n, cached=False)
    tr = traffic(registry.schedule(collective, name, p, n), 1)
    assert t.sent().tolist() == tr.bytes_sent.sum(axis=1).tolist()
    assert t.received().tolist() == tr.bytes_received.sum(axis=1).tolist()


@pytest.mark.parametrize("root", [None, -1, 4, 1.0, True])
@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_checker_names_a_rooted_schedule_without_a_valid_root(collective, root):
    """A broadcast or reduce whose root is not a rank was a TypeError (None), an IndexError
    (4 of 4 ranks), or, for -1, checked as if rank 3 were the root."""
    s = build("x", collective, 4, 8, [[Transfer(3, 0, 0, 8, "sum" if collective == "reduce"
                                                 else "copy")]], root=root)
    for f in (check, run_symbolic, expected_state):
        with pytest.raises(ScheduleError, match=rf"x {collective} p=4: root must be a rank in "
                                                rf"0\.\.3, got {root!r}"):
            f(s)


def test_checker_refuses_a_transfer_of_negative_count():
    """A transfer of -3 elements passed the range check (its stop is below its start), so a
    ring with one appended passed, while the cost model charged it a message of -12 bytes
    and the executor never sent it."""
    good = registry.schedule("allreduce", "ring", 3, 9)
    bad = Schedule("x", "allreduce", 3, 9,
                   good.steps + (Step((Transfer(0, 1, 6, -3, "sum"),)),))
    with pytest.raises(ScheduleError, match=r"x: step 4 transfer .*count=-3.* has a negative "
                                            "count"):
        check(bad)


@pytest.mark.parametrize("bps", [0, -1e9, float("nan"), float("inf")])
def test_cost_params_for_a_link_without_bandwidth_is_one_line(bps):
    with pytest.raises(GradwireError, match="bandwidth"):
        CostParams.for_link(bps)


def test_a_schedule_hashes_its_steps_once(monkeypatch):
    """Every collective call looks its schedule up in the executor's caches by hash: hashing
    the steps each time cost O(transfers) a call (200 µs for a ring at P = 64). The hash is
    kept; equal schedules still hash alike, and a pickled copy (another process's string
    hashes) computes its own."""
    import dataclasses
    import pickle

    hashed = []
    plain = Step.__hash__
    monkeypatch.setattr(Step, "__hash__", lambda self: hashed.append(1) or plain(self))
    # a copy of its own: the registry's cached one may have been hashed by an earlier test
    s = dataclasses.replace(registry.schedule("allreduce", "ring", 8, 1000))
    first = hash(s)
    seen = len(hashed)
    assert seen and hash(s) == first and len(hashed) == seen
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and hash(copy) == first and len(hashed) == 2 * seen
