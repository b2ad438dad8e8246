"""Defects of the performance model's inputs and terms: cluster terms that were never checked,
misspelt fields of codec tables and calibration files priced as 0 without a word, a calibration
without its CPU terms, advise's --density named as no option is, and a token bucket's credit
that took coding on shared cores at its one-rank time."""

from __future__ import annotations

import json

import calibration_doc
import pytest

from gradwire import profiles
from gradwire.errors import GradwireError
from gradwire.perf import calibration, codecs, scenario
from gradwire.perf.codecs import CodecTable
from gradwire.perf.model import Aggregation, ClusterModel, predict


@pytest.mark.parametrize(("kw", "msg"), [
    ({"compute_slowdown": float("nan")}, "compute slowdown must be a finite number >= 1"),
    ({"compute_slowdown": 0.0}, "compute slowdown must be a finite number >= 1"),
    ({"compute_slowdown": float("inf")}, "compute slowdown must be a finite number >= 1"),
    ({"alpha_transport": -1e-4}, "alpha of gradwire's executor"),
    ({"alpha_transport": float("nan")}, "alpha of gradwire's executor"),
    ({"gamma_dtype": (("fp16", 1e-9),)}, "'fp16' is not a dtype name"),
    ({"gamma_dtype": (("half", 1e-9),)}, "'half' is not a dtype name"),
])
def test_cluster_refuses_compute_slowdown_executor_alpha_and_dtypes_it_never_checked(kw, msg):
    """A NaN compute slowdown or executor α made every prediction NaN (a negative α, negative
    communication), and a γ under a name gamma_of never looks up was dropped unsaid."""
    with pytest.raises(GradwireError, match=msg):
        ClusterModel(4, 1e9, 1e-4, **kw)
    # what the model prices is kept
    ClusterModel(4, 1e9, 1e-4, compute_slowdown=2.0, alpha_transport=0.0,
                 gamma_dtype=(("float16", 1e-9), ("bfloat16", 2e-9)))


def test_a_codec_table_s_misspelt_field_is_one_line(tmp_path):
    """``merge_S`` for ``merge_s`` was ignored: gTop-k's merges were priced at 0."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"numel": 1000, "methods": {
        "gtopk": {"params": {}, "encode_s": 1e-3, "decode_s": 1e-4, "merge_S": 1e-3}}}))
    with pytest.raises(GradwireError, match=r"methods\.gtopk\.merge_S: unknown field "
                                            r"\(did you mean 'merge_s'\?\)") as e:
        codecs.load(str(path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("change", "field"), [
    ({"cpu": calibration_doc.cpu(cpu_calls_s=1e-3)}, "cpu.cpu_calls_s"),
    ({"overlap": {"model": "mlp", "backward_s": 0.05, "with_comm_s": 0.055,
                  "comm_bytes": 10**8, "comm_byte": 1}}, "overlap.comm_byte"),
    ({"coding": {"method": "topk", "numel": 1000, "backward_s": 0.05, "encode_s": 0.01,
                 "together_s": 0.059, "extra": 1}}, "coding.extra"),
    ({"compute": {"model": "mlp", "alone_s": 0.01, "together_s": 0.02, "alone": 1}},
     "compute.alone"),
    ({"reduce": {"nbytes": 1000, "float32_s": 1e-3, "float16_s": 2e-3, "bfloat16_s": 2e-3,
                 "float16": 1}}, "reduce.float16"),
    ({"codecs": {**calibration_doc.codecs(("topk",)), "dtypes": "float32"}}, "codecs.dtypes"),
])
def test_a_calibration_s_unknown_nested_field_is_one_line(change, field):
    """Unknown fields at the top of the file were refused, inside its objects not: a
    misspelt ``cpu_call_s`` (optional) left the backend's calls costing nothing."""
    with pytest.raises(GradwireError, match=f"unknown field '{field}'") as e:
        calibration.parse(calibration_doc.doc(**change), "cal.json")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("change", "message"), [
    ({"nodes": 1}, r"field 'nodes' is 1, but 2 ranks at 1 a node are 2 nodes"),
    ({"world": 8, "ranks_per_node": 3, "nodes": 2}, r"field 'nodes' is 2, but 8 ranks at 3 a node "
                                                    r"are 3 nodes"),
    ({"ranks_per_node": 4, "nodes": 1}, r"field 'ranks_per_node' is 4, more than the 2 ranks "
                                          r"of 'world'"),
    ({"beta_between": "ranks of one node"}, r"field 'beta_between' is 'ranks of one node', but "
                                            r"with 2 node\(s\) calibrate measures β between "
                                            r"nodes"),
])
def test_a_calibration_s_world_nodes_and_link_must_agree(change, message):
    """world, ranks_per_node, nodes and beta_between were each read alone: a hand-edited file
    could say 8 ranks on 2 nodes of 3, or β between nodes on one node."""
    with pytest.raises(GradwireError, match=f"^cal.json: {message}$"):
        calibration.parse(calibration_doc.doc(**change), "cal.json")
    one_node = calibration_doc.doc(world=4, ranks_per_node=4, nodes=1,
                                   beta_between="ranks of one node")
    assert calibration.parse(one_node, "cal.json").nodes == 1
    assert calibration.parse(calibration_doc.doc(world=8, ranks_per_node=3, nodes=3),
                             "cal.json").nodes == 3


def test_a_call_s_alpha_may_be_its_ring_s_steps_at_the_largest_alpha():
    """alpha_call_s is α's time for the 2(P−1) steps of one call; it was held to α's own bound
    of 1 s, so a calibration of thousands of ranks at a slow α was refused."""
    world = 4000
    doc = calibration_doc.doc(world=world, nodes=world, alpha_s=0.5,
                              alpha_call_s=0.5 * 2 * (world - 1))
    assert calibration.parse(doc, "cal.json").alpha_call_s == 3999.0
    with pytest.raises(GradwireError, match="alpha_call_s"):
        calibration.parse({**doc, "alpha_call_s": 2 * (world - 1) + 1.0}, "cal.json")


def test_a_calibration_without_its_cpu_field_is_refused():
    """``cpu`` is null on CUDA; a file that lacks it was read as if it were, and predictions
    lost the shared cores' bound."""
    doc = calibration_doc.doc()
    del doc["cpu"]
    with pytest.raises(GradwireError, match="field 'cpu' is missing"):
        calibration.parse(doc, "cal.json")
    assert calibration.parse(calibration_doc.doc(cpu=None), "cal.json").cpu is None


@pytest.mark.parametrize("density", [0.0, 2.0, float("nan")])
def test_advise_and_whatif_name_the_density_option(density):
    """Every other command says "--density must be in (0, 1]"; advise and whatif said
    "density", naming no option."""
    s = scenario.Scenario(agg="topk", density=density)
    for ask in (lambda: scenario.advise(s, 4, "1gbit", 1.0),
                lambda: scenario.whatif(s, "4", "1gbit", "1")):
        with pytest.raises(GradwireError, match=r"^--density must be in \(0, 1\]"):
            ask()


def test_a_token_bucket_earns_credit_through_encode_as_long_as_it_takes_on_shared_cores():
    """Point 7: the link idles through the bucket's encode as it runs in the timeline; with
    two ranks on one core (point 5) that is twice its one-rank time. The credit counted the
    one-rank time: 3 ms of idle link for 4 ms."""
    prof = profiles.parse('{"format": 1, "model": "one", "forward_s": 0.001, '
                          '"backward_s": 0.001, "step_s": 0.0, "params": [["w", 1000000]]}',
                          "one")
    table = CodecTable("t", 1_000_000, {"topk": {"encode_s": 1e-3, "decode_s": 0.0}}, "t")
    agg = Aggregation("topk", density=0.1, mode="model")  # 800 kB a rank: more than the credit

    def saved(**kw: object) -> float:
        plain, credited = (predict(prof, ClusterModel(2, 8e8, 0.0, beta=1e-8, burst=b,
                                                      check_calls=False, **kw), agg, table)
                           for b in (0.0, 1e12))
        return float(plain.communicate - credited.communicate)

    # forward, step and backward until ready (2 ms) and the encode
    assert saved() == pytest.approx(0.002 + 0.001)
    assert saved(cores=1, cpu_ranks=2, cpu_share=1.0) == pytest.approx(0.002 + 2 * 0.001)
