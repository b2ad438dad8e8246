"""Built-in profiles: exact parameter counts, files in step with their definitions, and one-line
errors that name the line or field of a malformed profile."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradwire import profiles
from gradwire.errors import GradwireError
from gradwire.models import num_parameters, resnet50
from gradwire.profiles import architectures
from gradwire.profiles.measure import measure

# Published totals (torchvision, Hugging Face bert-base-uncased BertModel, He et al. 2016).
KNOWN = {
    "resnet20": 269_722,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet200": 64_673_832,
    "vgg16": 138_357_544,
    "alexnet": 61_100_840,
    "inception-v3": 27_161_264,
    "bert-base": 109_482_240,
}


def test_every_builtin_profile_has_its_published_parameter_count() -> None:
    assert profiles.builtin_names() == sorted(KNOWN)
    for name, count in KNOWN.items():
        assert profiles.load(name).numel == count, name


def test_profile_files_hold_their_definitions_in_backward_order() -> None:
    for name in KNOWN:
        assert list(profiles.load(name).params) == architectures.backward_order(name), name


def test_profile_files_hold_their_definitions_shapes() -> None:
    for name in KNOWN:
        assert list(profiles.load(name).shapes) == architectures.backward_shapes(name), name


def test_every_builtin_shape_multiplies_out_to_its_elements() -> None:
    for name in profiles.builtin_names():
        p = profiles.load(name)
        assert p.shapes is not None and len(p.shapes) == len(p.params), name
        for (tensor, n), shape in zip(p.params, p.shapes, strict=True):
            assert shape is not None and math.prod(shape) == n, (name, tensor)


def test_builtin_shapes_are_pytorchs() -> None:
    r50 = profiles.load("resnet50")
    assert r50.shapes[-1] == (64, 3, 7, 7)  # conv1: first registered, last in backward order
    assert dict(zip((n for n, _ in r50.params), r50.shapes, strict=True))["fc.weight"] == (1000,
                                                                                          2048)
    shapes = dict(zip((n for n, _ in profiles.load("inception-v3").params),
                      profiles.load("inception-v3").shapes, strict=True))
    assert shapes["Mixed_6b.branch7x7_2.conv.weight"] == (128, 128, 1, 7)
    assert shapes["Mixed_6b.branch7x7_3.conv.weight"] == (192, 128, 7, 1)
    bert = dict(zip((n for n, _ in profiles.load("bert-base").params),
                    profiles.load("bert-base").shapes, strict=True))
    assert bert["embeddings.word"] == (30522, 768)
    assert bert["encoder.layer.0.intermediate.dense.weight"] == (3072, 768)
    assert bert["encoder.layer.0.output.LayerNorm.bias"] == (768,)


def test_resnet50_definition_matches_the_project_model_tensor_by_tensor() -> None:
    built = [tuple(p.shape) for p in resnet50(1000, 3).parameters()]
    assert [shape for _, shape in architectures.ARCHITECTURES["resnet50"]()] == built
    assert num_parameters(resnet50(1000, 3)) == KNOWN["resnet50"]


def test_every_compute_time_names_its_source() -> None:
    for name in KNOWN:
        p = profiles.load(name)
        assert {"params", "forward_s", "backward_s"} <= set(p.sources), name
        if p.has_compute:
            assert "Table" in p.sources["backward_s"], name


def _doc(**changes: object) -> str:
    doc = {"format": 1, "model": "toy", "forward_s": 0.01, "backward_s": 0.02,
           "params": [["b", 10], ["w", 100]], **changes}
    return json.dumps(doc, indent=1)


@pytest.mark.parametrize(("changes", "message"), [
    ({"params": [["b", 10], ["w", -3]]}, "field 'params[1]' must be [name, elements >= 1]"),
    ({"forward_s": "fast"}, "field 'forward_s' must be a finite number of seconds"),
    ({"forward_s": float("nan")}, "field 'forward_s' must be a finite number of seconds >= 0"),
    ({"step_s": float("inf")}, "field 'step_s' must be a finite number of seconds >= 0, got inf"),
    ({"backward_layer_s": [0.1]}, "field 'backward_layer_s' must be a list of 2 finite numbers"),
    ({"backward_layer_s": [0.1, float("-inf")]}, "field 'backward_layer_s' must be a list of 2"),
    ({"backward_layer_s": [5, 5]}, "field 'backward_layer_s' must sum to backward_s (0.02 s) "
                                   "within 0.1%, got 10 s"),
    ({"backward_layer_s": [0.01, 0.0099]}, "field 'backward_layer_s' must sum to backward_s"),
    ({"backward_s": 0, "backward_layer_s": [0.01, 0.01]}, "must sum to backward_s (0 s)"),
    ({"dtype": "int8"}, "field 'dtype' must be one of float32"),
    ({"format": 2}, "field 'format' must be 1"),
    ({"backwards_s": 1.0}, "unknown field 'backwards_s' (did you mean 'backward_s'?)"),
])
def test_malformed_profile_names_the_field(changes: dict, message: str) -> None:
    with pytest.raises(GradwireError, match=None) as e:
        profiles.parse(_doc(**changes), "toy.json")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_layer_times_that_sum_to_backward_are_kept() -> None:
    """Rounding within 0.1 % is accepted; without backward_s, the layers' sum is backward's."""
    p = profiles.parse(_doc(backward_layer_s=[0.005, 0.01501]), "toy.json")
    assert p.backward_layer_s == (0.005, 0.01501) and p.backward_s == 0.02
    p = profiles.parse(_doc(backward_s=None, backward_layer_s=[0.005, 0.015]), "toy.json")
    assert p.backward_s == pytest.approx(0.02)
    assert profiles.parse(_doc(backward_s=0, backward_layer_s=[0, 0]), "toy.json").backward_s == 0


def test_every_shipped_profile_file_is_accepted() -> None:
    """The profiles gradwire profile wrote into the benchmark results (their layer times split
    backward_s, so they sum to it up to floating point) all parse."""
    root = Path(__file__).parent.parent / "benchmarks" / "results"
    found = 0
    for path in sorted(root.rglob("*.json")):
        doc = json.loads(path.read_text())
        for key, v in (doc.items() if isinstance(doc, dict) else ()):
            if isinstance(v, dict) and v.get("format") == 1 and isinstance(v.get("params"),
                                                                           list):
                profiles.parse(json.dumps(v), f"{path}: {key}")
                found += 1
    assert found > 0
    for name in profiles.builtin_names():
        profiles.load(name)


def test_shapes_parse_and_round_trip_in_mixed_files() -> None:
    p = profiles.parse(_doc(params=[["b", 10], ["w", 100, [10, 2, 5]], ["s", 1, []]]), "toy.json")
    assert p.params == (("b", 10), ("w", 100), ("s", 1))
    assert p.shapes == (None, (10, 2, 5), ())
    assert '["w", 100, [10, 2, 5]]' in p.to_text() and '["b", 10],' in p.to_text()
    assert profiles.parse(p.to_text(), "again") == p
    assert p.with_compute(1.0, 2.0, "x").shapes == p.shapes
    assert profiles.parse(_doc(), "toy.json").shapes is None


@pytest.mark.parametrize(("row", "message"), [
    (["w", 21, [4, 5]], "toy.json: params[1]: shape [4, 5] has 20 elements, the row says 21"),
    (["w", 100, [10, 0, 10]], "params[1]: shape must be a list of integers >= 1"),
    (["w", 100, [10, -10, -1]], "params[1]: shape must be a list of integers >= 1"),
    (["w", 100, [10, 10.0]], "params[1]: shape must be a list of integers >= 1 ([] for a 0-d"),
    (["w", 100, [10, True]], "params[1]: shape must be a list of integers >= 1"),
    (["w", 100, "10x10"], "params[1]: shape must be a list of integers >= 1"),
    (["w", 100, None], "params[1]: shape must be a list of integers >= 1"),
    (["w", 2, []], "params[1]: shape [] has 1 elements, the row says 2"),
    (["w", 100, [10, 10], "extra"], "field 'params[1]' must be [name, elements >= 1] or [name, "
                                    "elements, shape]"),
])
def test_malformed_shape_names_the_row(row: list, message: str) -> None:
    with pytest.raises(GradwireError) as e:
        profiles.parse(_doc(params=[["b", 10], row]), "toy.json")
    assert message in str(e.value) and "\n" not in str(e.value)


_shape = st.lists(st.integers(1, 9), max_size=4).map(tuple)


@given(st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), _shape)), min_size=1,
                max_size=12))
def test_any_params_with_shapes_round_trip(rows: list) -> None:
    p = profiles.Profile("toy", tuple((name, math.prod(s) if s is not None else 7)
                                      for name, s in rows),
                         0.01, 0.02, shapes=tuple(s for _, s in rows))
    assert profiles.parse(p.to_text(), "toy.json") == p


def test_a_profile_with_a_time_that_is_not_finite_is_not_written() -> None:
    """to_text wrote NaN, which no strict JSON reader (and not gradwire's own) takes back."""
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="not JSON compliant"):
            profiles.Profile("toy", (("w", 4),), bad, 0.02).to_text()


def test_invalid_json_names_the_line(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(_doc().replace('"backward_s": 0.02,', '"backward_s": 0.02,,'))
    with pytest.raises(GradwireError, match=r"bad.json: line 5, column \d+: not valid JSON"):
        profiles.load(str(path))


def test_a_binary_profile_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(GradwireError, match=r"bin.json: not a text file$"):
        profiles.load(str(path))


def test_unknown_profile_suggests_a_name() -> None:
    with pytest.raises(GradwireError, match="did you mean 'resnet50'"):
        profiles.load("resnet-50")


def test_measured_profile_round_trips_and_orders_tensors_as_backward_does(tmp_path) -> None:
    p = measure("mlp-small", batch_size=8, iters=2, warmup=1)
    # mlp-small registers 0.weight, 0.bias, ..., 4.weight, 4.bias: backward meets the last first.
    assert p.params[0][0].endswith("bias") and p.params[-1][0] == "0.weight"
    assert sum(p.backward_layer_s) == pytest.approx(p.backward_s)
    assert len(p.shapes[-1]) == 2 and p.shapes[0] == (p.params[0][1],)  # 0.weight; last bias
    assert all(math.prod(s) == n for (_, n), s in zip(p.params, p.shapes, strict=True))
    path = tmp_path / "p.json"
    path.write_text(p.to_text())
    assert profiles.load(str(path)) == p


def test_a_measured_profile_named_as_a_builtin_one_says_which_is_which(monkeypatch, capsys):
    """`gradwire profile --model resnet50` measures gradwire's resnet50 on digits (23.5 M
    parameters), while `advise --model resnet50` reads the built-in ImageNet profile (25.6 M):
    the same name, silently two models."""
    from conftest import run_cli

    from gradwire.cli import options
    from gradwire.perf.report import builtin_namesake

    p = measure("resnet20", batch_size=2, iters=1, warmup=0)
    line = builtin_namesake(p.model, p.numel)
    assert line is not None and f"({p.numel:,} parameters)" in line
    assert "whatif, advise and simulate --model resnet20 read the built-in profile of that " \
        "name (ResNet-20 for CIFAR-10" in line and line.endswith("give them this one as " \
                                                                  "--model FILE")
    small = measure("mlp-small", batch_size=8, iters=1, warmup=0)
    assert builtin_namesake(small.model, small.numel) is None
    monkeypatch.setattr(options.console, "width", 1000)
    code, out, err = run_cli(monkeypatch, capsys, ["profile", "--model", "resnet20", "--iters",
                                                   "1", "--warmup", "0", "--batch-size", "2"])
    assert code == 0, err
    assert " ".join(line.split()) in " ".join(out.split())
