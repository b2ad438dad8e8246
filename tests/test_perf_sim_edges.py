"""Edge cases of the performance model (gradwire.perf) and the simulator (gradwire.sim) that
once went wrong: bucketing the §5 budget's dense run as asked, the executor's α inside a node,
calibration files with numbers too large for the model, and mechanisms that take no time."""

from __future__ import annotations

import json

import calibration_doc
import pytest
from conftest import cli_error

from gradwire.perf import codecs
from gradwire.perf import whatif as w
from gradwire.perf.model import Aggregation, ClusterModel, predict
from gradwire.profiles import Profile
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.mechanisms import parse_list, run
from gradwire.sim.report import results_table, speedups

# 16 tensors of 4 MiB: several DDP buckets, so the bucketing asked for matters
PROFILE = Profile("sixteen", tuple((f"t{i}", 1 << 20) for i in range(16)), 0.01, 0.05)


@pytest.mark.parametrize("bucketing", [{"mode": "model"}, {"bucket_mb": 1.0}])
def test_the_coding_budget_prices_dense_with_the_bucketing_asked_for(bucketing):
    """The §5 encode+decode budget is what backward does not hide of the dense iteration. It
    was predicted with DDP's default buckets whenever dense was not among --agg, and with the
    buckets asked for (--mode, --bucket-mb) when it was: one question, two answers."""
    table, setting = codecs.load("v100"), w.Setting(alpha=5e-5, gamma=0.0)
    rates = [1e9, 1e10]
    alone = w.sweep(PROFILE, [Aggregation("topk", **bucketing)], [8], rates, [1.0], table,
                    setting)
    beside = w.sweep(PROFILE, [Aggregation("dense", **bucketing),
                               Aggregation("topk", **bucketing)], [8], rates, [1.0], table,
                     setting)
    budget = [a["coding_budget_s"] for a in alone["answers"]]
    assert budget == pytest.approx([a["coding_budget_s"] for a in beside["answers"]])
    dense = [r["exposed_s"] for r in beside["rows"] if r["method"] == "dense"]
    assert budget == pytest.approx(dense)


def test_the_executors_alpha_holds_inside_a_node_too():
    """Point 9: what gradwire's executor runs (Top-k's schedule, the call headers) takes the
    executor's α. With every rank on one node all its messages are inside the node, where
    the backend's α was charged instead: the executor's α changed nothing."""
    table = codecs.load("v100")
    prof = PROFILE

    def wire(ranks_per_node: int, alpha_transport: float | None) -> float:
        c = ClusterModel(4, 1e9, 5e-5, ranks_per_node=ranks_per_node,
                         alpha_transport=alpha_transport, check_calls=True)
        return float(predict(prof, c, Aggregation("topk"), table).communicate)

    for g in (1, 2, 4):
        assert wire(g, 1e-3) > wire(g, None) + 1e-3, g
    # dense runs on the backend: the executor's α is not its α, in a node or between nodes
    for g in (1, 4):
        c = [ClusterModel(4, 1e9, 5e-5, ranks_per_node=g, alpha_transport=a,
                          check_calls=False) for a in (None, 1e-3)]
        dense = [float(predict(prof, x, Aggregation("dense"), table).communicate) for x in c]
        assert dense[0] == dense[1]


BIG = 10**400  # a whole number JSON holds and a float cannot


@pytest.mark.parametrize("fields, field", [
    ({"cpu": calibration_doc.cpu(cores_per_machine=BIG)}, "cpu.cores_per_machine"),
    ({"reduce": {"nbytes": BIG, "float32_s": 1e-3, "float16_s": 2e-3, "bfloat16_s": 2e-3}},
     "reduce.nbytes"),
    ({"gamma_s_per_byte": 1e300}, "gamma_s_per_byte"),
    ({"alpha_s": 1e300}, "alpha_s"),
    ({"codecs": calibration_doc.codecs(("dense", "topk"), encode_s=1e300)},
     "codecs.methods.dense.encode_s"),
])
def test_a_calibration_with_numbers_too_large_is_one_line(fields, field, tmp_path, monkeypatch,
                                                          capsys):
    """A count too large for a float crashed the model (OverflowError), and seconds near the
    float's limit came out as predictions of "inf ms"; both are refused, naming the field,
    at the bounds profiles and traces have (gradwire.check.MAX_BYTES, MAX_SECONDS)."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(calibration_doc.doc(**fields)))
    code, err = cli_error(monkeypatch, capsys, "advise", "--model", "resnet20", "--compute-ms",
                          "10,20", "--workers", "4", "--bandwidth", "1gbit", "--agg",
                          "dense,topk", "--calibration", str(path))
    assert code == 2, err
    assert err.startswith("gradwire: error: ") and err.count("\n") == 1, err
    assert field in err and "Traceback" not in err, err


def test_a_mechanism_that_takes_no_time_has_a_speed_up_not_a_traceback():
    """One worker and a trace without compute: a collective has nothing to do, its iteration
    takes 0 s, and the speed-up over the parameter server divided by it."""
    t = tr.synthetic("zero", [8, 16], 0.0, 0.0)
    c = SimCluster(1, 1e9, iterations=2)
    results = run(t, c, parse_list("ps,ring"))
    assert results[1].iteration_s == 0.0 < results[0].iteration_s
    sp = speedups(results)
    assert sp["ps"] == 1.0 and sp["ring"] == float("inf")
    results_table(results, "zero")  # renders
    alone = run(t, c, parse_list("ring,butterfly"))  # the baseline itself takes no time
    assert speedups(alone) == {"ring": 1.0, "butterfly": 1.0}


def test_link_rates_that_differ_are_columns_of_their_own():
    """Rates are told apart by the label the tables and the JSON give them: two rates that
    both printed as "1gbit" made two columns under one header, and two JSON rows for one
    (workers, "1gbit") that said different things. Each rate prints as itself."""
    from gradwire.perf import scenario

    s = scenario.Scenario(model="resnet20", agg="dense", compute_ms="10,20")
    wi = scenario.whatif(s, "2,4", "1gbit,1.0000001gbit,10gbit,1000mbit", "1")
    labels = [r["bandwidth"] for r in wi.result["rows"]]
    assert labels == ["1gbit", "1.0000001gbit", "10gbit"] * 2
    assert len({(r["workers"], r["bandwidth"]) for r in wi.result["answers"]}) == 6
