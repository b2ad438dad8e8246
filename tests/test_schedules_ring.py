"""The ring's fast table builder against its reference: the algorithm written one Transfer at a
time (ring.ring_steps), for P = 1…17, odd and even counts, and every sub-chunk pipeline."""
import pytest

from gradwire.schedules import registry, ring
from gradwire.schedules.check import check
from gradwire.schedules.ir import build

COUNTS = [0, 1, 13, 64, 1000]
PIPELINES = [None, 1, 2, 3, 8]  # None: the builders' own choice (1 at these sizes)
PHASES = {"allreduce": ring.ALLREDUCE, "reducescatter": ring.REDUCE_SCATTER,
          "allgather": ring.ALLGATHER}


def reference(collective: str, p: int, count: int, pipeline: int):
    steps = ring.ring_steps(p, count, PHASES[collective], pipeline)
    return build("ring", collective, p, count, [st.transfers for st in steps])


@pytest.mark.parametrize("p", range(1, 18))
@pytest.mark.parametrize("collective", sorted(PHASES))
def test_table_builds_the_reference_transfers_step_by_step(p, collective):
    algo = registry.get(collective, "ring")
    for count in COUNTS:
        for pipeline in PIPELINES:
            got = algo.build(p, count, pipeline=pipeline)
            if pipeline is not None:  # as asked, but no more sub-chunks than a chunk has
                assert got.params["pipeline"] == min(pipeline, max(1, -(-count // p)))
            want = reference(collective, p, count, got.params["pipeline"])
            assert len(got.steps) == len(want.steps), (p, count, pipeline)
            for i, (a, b) in enumerate(zip(got.steps, want.steps, strict=True)):
                assert a.transfers == b.transfers, (p, count, pipeline, f"step {i}")


@pytest.mark.parametrize("p", range(1, 18))
def test_rotated_allgather_table_matches_the_reference(p):
    """scatter_allgather's ring: the allgather phase rotated so rank r starts with block
    (r − root) mod p."""
    for count in COUNTS:
        for root in range(p):
            table = ring.ring_table(p, count, ((-root, False),), 1)
            steps = ring.ring_steps(p, count, ((-root, False),), 1)
            assert table.transfers_of() == [list(st.transfers) for st in steps if st.transfers]


@pytest.mark.parametrize("p", range(1, 18))
def test_reference_is_a_correct_ring(p):
    """What the table is held to is itself right: every rank ends with what it should
    (symbolically), and every transfer goes from r to r+1."""
    for collective in PHASES:
        for count in COUNTS:
            for pipeline in (1, 3):
                s = reference(collective, p, count, pipeline)
                check(s)
                assert all(t.dst == (t.src + 1) % p for _, t in s.transfers())
