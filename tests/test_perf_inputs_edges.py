"""The performance model's inputs and outputs: profile fields of the wrong JSON type, a folder
named as a built-in profile, huge nodes, dense ranked without a codec row, small-model titles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradwire import profiles
from gradwire.errors import GradwireError
from gradwire.perf import comm, report, scenario
from gradwire.perf.model import MAX_WORKERS
from gradwire.schedules import registry

ONE = {"format": 1, "model": "one", "forward_s": 0.001, "backward_s": 0.002,
       "params": [["w", 1]]}


def _profile(**changes: object) -> str:
    return json.dumps({**ONE, **changes})


@pytest.mark.parametrize("field, value", [("dtype", ["float32"]), ("dtype", {"a": 1}),
                                          ("description", 5), ("description", ["x"])])
def test_a_profile_field_of_another_json_type_is_one_line(field, value) -> None:
    """A list or object as dtype was a TypeError (unhashable) and a number as description was
    taken as its text: both are one line naming the field."""
    with pytest.raises(GradwireError, match=f"field '{field}' must be"):
        profiles.parse(_profile(**{field: value}), "p.json")


def test_a_null_or_text_description_is_kept() -> None:
    assert profiles.parse(_profile(description=None), "p.json").description == ""
    assert profiles.parse(_profile(description="mine"), "p.json").description == "mine"


def test_a_directory_named_as_a_builtin_profile_does_not_hide_it(tmp_path,
                                                                  monkeypatch) -> None:
    """A run's output folder "resnet50" in the working directory made --model resnet50 an
    error ("profile file 'resnet50' is not a regular file"): a directory is never a profile,
    so the built-in one is meant."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "resnet50").mkdir()
    assert profiles.load("resnet50").numel == 25_557_032
    (tmp_path / "mine").mkdir()  # no built-in of that name: still the file's error
    with pytest.raises(GradwireError, match="not a regular file"):
        profiles.load("mine")


def test_a_node_of_more_ranks_than_the_cluster_is_one_node_of_them_all() -> None:
    """ranks_per_node above P padded every step's rows to the ranks it named: a count of
    2**40 asked for terabytes (MemoryError). A node that holds every rank costs the same
    whatever count it names."""
    table = registry.table("allreduce", "ring", 4, 64, pipeline=1)
    many, four = comm.summarise(table, 2**40), comm.summarise(table, 4)
    assert many.count == four.count and len(many.groups) == len(four.groups)
    for (m, a), (n, b) in zip(many.groups, four.groups, strict=True):
        assert m == n and np.array_equal(a, b)
    many = comm.seconds("allreduce", "ring", 4, 1000, 4, 5e-5, 8e-9,
                        node=comm.Node(2**40, 1e-6, 8e-11), pipeline=1)
    four = comm.seconds("allreduce", "ring", 4, 1000, 4, 5e-5, 8e-9,
                        node=comm.Node(4, 1e-6, 8e-11), pipeline=1)
    assert float(many) == float(four) > 0


def test_ranks_per_node_above_what_the_model_prices_is_one_line() -> None:
    s = scenario.Scenario(agg="dense", ranks_per_node=MAX_WORKERS + 1)
    with pytest.raises(GradwireError, match=f"--ranks-per-node must be at most {MAX_WORKERS}"):
        scenario.advise(s, 8, "1gbit", 1.0)


def test_advise_ranks_dense_with_a_codec_table_of_the_compressors_alone(tmp_path) -> None:
    """dense encodes nothing: a table that times only the compressors left it out of advise's
    ranking ("not ranked: dense"), while whatif priced it from the same table."""
    table = tmp_path / "codecs.json"
    table.write_text(json.dumps({"numel": 25_557_032, "source": "mine", "methods": {
        "topk": {"encode_s": 0.01, "decode_s": 0.001}}}))
    s = scenario.Scenario(agg="dense,topk", codecs=str(table))
    a = scenario.advise(s, 16, "1gbit", 1.0)
    assert sorted(r.agg.method for r in a.ranked) == ["dense", "topk"]
    assert a.skipped == []
    wi = scenario.whatif(s, "16", "1gbit", "1")
    dense = next(r for r in wi.result["rows"] if r["method"] == "dense")
    ranked = next(r for r in a.ranked if r.agg.method == "dense")
    assert ranked.seconds == pytest.approx(dense["iteration_s"])


def test_a_sourceless_tiny_profile_is_labelled_as_it_is(tmp_path) -> None:
    """whatif printed "compute: ;" for a profile file naming no source of its times, and
    titled a model of 1 parameter "0.00 M params"."""
    path = tmp_path / "one.json"
    path.write_text(_profile())
    found = scenario.whatif(scenario.Scenario(model=str(path), agg="dense"), "2", "1gbit", "1")
    assert "compute: ;" not in found.note and "compute:" not in found.note
    title = str(report.whatif_tables(found)[0].title)
    assert "(1 param)" in title and "0.00 M" not in title
    big = scenario.whatif(scenario.Scenario(agg="dense"), "2", "1gbit", "1")
    assert "(25.56 M params)" in str(report.whatif_tables(big)[0].title)
    assert "compute: compression-utility paper" in big.note

