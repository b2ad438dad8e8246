"""Built-in profiles: exact parameter counts, files in step with their definitions, and one-line
errors that name the line or field of a malformed profile."""

from __future__ import annotations

import json

import pytest

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


def test_resnet50_definition_matches_the_project_model_tensor_by_tensor() -> None:
    built = [p.numel() for p in resnet50(1000, 3).parameters()]
    assert [n for _, n in architectures.ARCHITECTURES["resnet50"]()] == built
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
    ({"dtype": "int8"}, "field 'dtype' must be one of float32"),
    ({"format": 2}, "field 'format' must be 1"),
    ({"backwards_s": 1.0}, "unknown field 'backwards_s' (did you mean 'backward_s'?)"),
])
def test_malformed_profile_names_the_field(changes: dict, message: str) -> None:
    with pytest.raises(GradwireError, match=None) as e:
        profiles.parse(_doc(**changes), "toy.json")
    assert message in str(e.value) and "\n" not in str(e.value)


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
    path = tmp_path / "p.json"
    path.write_text(p.to_text())
    assert profiles.load(str(path)) == p
