"""gradwire advise and whatif at large P, and options they would not read.

At P = 4095 every DDP bucket is below the ring's reference count, lcm(4095, 4096) elements, so
each bucket's size built a ring schedule of 2(P − 1)·P transfers to be priced (76-112 s for
`advise --workers 4095`). The ring's summary is now read from one step per phase
(comm.ring_summary), and with several ranks per node from one bit mask of row kinds per
rotation (comm.ring_node_summary): the tests hold them, and every prediction made with them,
equal to what the whole schedule gives."""

from __future__ import annotations

import json

import calibration_doc
import numpy as np
import pytest
from conftest import one_line_cli_error, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.perf import advise, codecs, comm, model
from gradwire.profiles import Profile
from gradwire.schedules import registry, ring

PHASES = {"allreduce": ring.ALLREDUCE, "reducescatter": ring.REDUCE_SCATTER,
          "allgather": ring.ALLGATHER}


def _same(a: comm.Summary, b: comm.Summary) -> bool:
    """Equal to the bit: the same count, groups in the same order, rows in the same order."""
    return a.count == b.count and len(a.groups) == len(b.groups) and all(
        m == n and r.shape == q.shape and r.tobytes() == q.tobytes()
        for (m, r), (n, q) in zip(a.groups, b.groups, strict=True))


@settings(max_examples=60, deadline=None)
@given(collective=st.sampled_from(sorted(PHASES)), p=st.integers(2, 40),
       count=st.integers(1, 3000))
def test_the_ring_summary_from_one_step_is_the_schedules(collective, p, count) -> None:
    built = comm.summarise(registry.table(collective, "ring", p, count, cached=False,
                                          pipeline=1))
    assert _same(comm.ring_summary(p, count, PHASES[collective]), built)


@settings(max_examples=80, deadline=None)
@given(collective=st.sampled_from(sorted(PHASES)), p=st.integers(2, 40),
       count=st.integers(1, 3000), per_node=st.integers(2, 45))
def test_the_ring_summary_on_nodes_is_the_schedules(collective, p, count, per_node) -> None:
    """Several ranks per node (the last node possibly smaller, or one node of them all):
    to the bit what summarise makes of the whole schedule."""
    built = comm.summarise(registry.table(collective, "ring", p, count, cached=False,
                                          pipeline=1), per_node)
    assert _same(comm.ring_node_summary(p, count, PHASES[collective], per_node), built)


def test_summarise_keeps_one_of_equal_rows() -> None:
    """Equal rows of a step are one row: hashed by a BLAS product, two equal rows could differ
    by an ulp and both be kept (P = 9, 3 ranks per node, 100 elements kept 7 groups of 6)."""
    s = comm.summarise(registry.table("allreduce", "ring", 9, 100, cached=False, pipeline=1), 3)
    for _, rows in s.groups:
        assert len(np.unique(rows, axis=0)) == len(rows)


def _profile(sizes: list[int]) -> Profile:
    return Profile("t", tuple((f"w{i}", n) for i, n in enumerate(sizes)), 0.01, 0.02)


def _fields(p: model.Prediction) -> dict:
    return {k: np.asarray(v).tolist() for k, v in vars(p).items()}


def _whole_schedules(fn):
    """``fn()`` with every summary built from the whole schedule, as before the one-step
    ring summaries (the caches cleared before and after)."""
    comm._summary.cache_clear()
    real = comm._ring_phases
    comm._ring_phases = lambda *a: None
    try:
        return fn()
    finally:
        comm._ring_phases = real
        comm._summary.cache_clear()


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 130), sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=4),
       method=st.sampled_from(["dense", "fp16", "powersgd", "signsgd", "gtopk"]),
       per_node=st.sampled_from([1, 1, 3]), bucket_kb=st.sampled_from([1.0, 4.0, 64.0]))
def test_predictions_with_ring_summaries_are_the_schedules(p, sizes, method, per_node,
                                                           bucket_kb) -> None:
    """Every number of a prediction is the same as with the whole schedules."""
    prof, table = _profile(sizes), codecs.load("h100")
    cluster = model.ClusterModel(p, np.array([1e9, 1e10]), 5e-5, 3e-12, ranks_per_node=per_node)
    agg = model.Aggregation(method, density=0.01, rank=2, bucket_mb=bucket_kb / 1024)
    before = _whole_schedules(lambda: model.predict(prof, cluster, agg, table, 1.0, 1.2))
    after = model.predict(prof, cluster, agg, table, 1.0, 1.2)
    assert _fields(after) == _fields(before)


@pytest.mark.parametrize("per_node", [1, 8])
def test_advise_at_an_odd_p_builds_no_ring_schedule_and_ranks_as_before(monkeypatch,
                                                                         per_node) -> None:
    """`advise --workers 4095` built a ring schedule for every bucket size it priced; at
    P = 257 (reference count 131,584) a 2-bucket model and PowerSGD's small calls do the
    same. Now none is built, and the ranking's numbers are the schedule's."""
    prof = _profile([300_000, 9_000, 120_000])
    cluster = model.ClusterModel(257, 1e9, 5e-5, 3e-12, ranks_per_node=per_node)
    table = codecs.load("h100")
    aggs = [model.Aggregation(m, bucket_mb=1.0) for m in ("dense", "fp16", "powersgd",
                                                          "signsgd", "gtopk")]
    reference = _whole_schedules(lambda: {a.label: _fields(model.predict(prof, cluster, a,
                                                                         table))
                                          for a in aggs})
    built = []
    real = ring.ring_table
    monkeypatch.setattr(ring, "ring_table", lambda *a: built.append(a[:2]) or real(*a))
    ranked, skipped = advise.rank(prof, cluster, aggs, table)
    assert built == [] and skipped == []
    assert {r.agg.label: _fields(r.prediction) for r in ranked} == reference


def test_ring_summaries_leave_what_they_do_not_price_to_the_schedule() -> None:
    """A pipelined ring, another algorithm, a bad parameter: built as before (the bad
    parameter still named by the registry)."""
    assert comm._ring_phases("allreduce", "ring", 8, 100, {"pipeline": 1}) == ring.ALLREDUCE
    assert comm._ring_phases("allgather", "ring", 8, 5, {}) == ring.ALLGATHER
    for args in ((8, 100, {"pipeline": 2}), (1, 100, {}), (8, 0, {}), (8, 100, {"block": 4}),
                 (8, 100, {"itemsize": 0})):
        assert comm._ring_phases("allreduce", "ring", *args) is None
    assert comm._ring_phases("allreduce", "rd", 8, 100, {}) is None
    with pytest.raises(Exception, match="block"):
        comm.summary("allreduce", "ring", 8, 100, block=4)


# ---- options whatif and advise would not read


@pytest.fixture
def cal(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(calibration_doc.doc()))
    return str(path)


@pytest.mark.parametrize("command", ["advise", "whatif"])
@pytest.mark.parametrize("extra, said", [
    (["--reference", "h100", "--calibration", "CAL"],
     "--reference h100 is what is assumed without a calibration"),
    (["--intra-bandwidth", "3.6tbit"], "--intra-bandwidth 3.6tbit is the link between the "
                                        "ranks of one node"),
    (["--intra-bandwidth", "3.6tbit", "--ranks-per-node", "1"], "give --ranks-per-node 2"),
    (["--density", "0.5"], "--density 0.5: no method of --agg dense takes it"),
    (["--rank", "2"], "--rank 2: no method of --agg dense takes it"),
])
def test_an_option_the_prediction_would_not_read_is_refused(monkeypatch, capsys, cal, command,
                                                            extra, said) -> None:
    """Each ran (exit 0) and printed predictions the option had no part in: --reference
    beside --calibration (the calibration's terms were used), --intra-bandwidth with one rank
    per node, --density or --rank where no method takes it. A method that takes it is
    given it."""
    args = [command, "--workers", "4", "--agg", "dense",
            *(cal if a == "CAL" else a for a in extra)]
    code, _, err = run_cli(monkeypatch, capsys, args)
    one_line_cli_error(code, err, said)
    if extra[0] in ("--density", "--rank"):
        code, _, err = run_cli(monkeypatch, capsys, [command, "--workers", "4", "--agg",
                                                     "dense,topk,powersgd", *extra])
        assert code == 0, err


@settings(max_examples=60, deadline=None)
@given(collective=st.sampled_from(sorted(PHASES)), p=st.integers(2, 40),
       count=st.integers(1, 3000))
def test_the_ring_cpu_totals_and_busiest_rank_from_one_step_are_the_schedules(collective, p,
                                                                              count) -> None:
    """The shared-CPU bound (cpu_seconds) and the token bucket's credit (busiest_bytes)
    also built the whole ring at every bucket size: 24 s of `advise --workers 4095
    --calibration` went to it."""
    def whole():
        return (comm._cpu_totals(collective, "ring", p, count, (("pipeline", 1),)),
                comm._busiest(collective, "ring", p, count, (("pipeline", 1),)))

    before = _whole_schedules(lambda: (comm._cpu_totals.cache_clear(),
                                       comm._busiest.cache_clear(), whole())[2])
    comm._cpu_totals.cache_clear()
    comm._busiest.cache_clear()
    assert whole() == before


def test_a_reference_setting_s_gamma_is_described_as_its_table_gives_it() -> None:
    """Two significant digits printed h100's 0.00115 ns/B as 0.0012."""
    from gradwire.perf import reference

    assert "γ 0.00115 ns/B" in reference.get("h100").describe()
    assert "γ 0.00333 ns/B" in reference.get("v100").describe()
