"""Edges of the models, the data, the profiles and trace recording: frozen and empty parameters,
batches too small for batch norm, and bad sizes or names as one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gradwire import profiles
from gradwire.data import text
from gradwire.errors import GradwireError
from gradwire.models import DIGITS_FLAT, MODELS, ModelSpec, build_model
from gradwire.profiles import architectures
from gradwire.profiles.measure import measure
from gradwire.sim import trace as tr
from gradwire.sim.record import record


class _PartlyTrained(nn.Module):
    """A digits MLP with a frozen first layer and an empty parameter (both used in forward)."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.frozen = nn.Linear(64, 16).requires_grad_(False)
        self.empty = nn.Parameter(torch.zeros(0))
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.frozen(x))) + self.empty.sum()


def _all_frozen(classes: int) -> nn.Module:
    return nn.Linear(64, classes).requires_grad_(False)


@pytest.fixture
def partly_trained(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(MODELS, "partly-trained",
                        ModelSpec(_PartlyTrained, "frozen and empty tensors", "digits",
                                  DIGITS_FLAT))
    return "partly-trained"


@pytest.fixture
def all_frozen(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(MODELS, "all-frozen",
                        ModelSpec(_all_frozen, "nothing trains", "digits", DIGITS_FLAT))
    return "all-frozen"


# ---------------------------------------------------------------- record (gradwire trace)


def test_record_leaves_out_frozen_and_empty_parameters(partly_trained: str) -> None:
    """A frozen parameter was a KeyError; an empty one a 0-byte row no trace file accepts."""
    t = tr.loads(tr.dumps(record(partly_trained, iterations=1, batch_size=4, warmup=0)))
    assert [p.name for p in t.params] == ["fc.weight", "fc.bias"]
    assert t.total_bytes == (16 * 10 + 10) * 4


def test_record_of_a_model_with_nothing_to_train_is_one_line(all_frozen: str) -> None:
    with pytest.raises(GradwireError, match="trace: model 'all-frozen' has no parameter to "
                       "train"):
        record(all_frozen, iterations=1, batch_size=2, warmup=0)


def test_record_refuses_a_batch_too_small_for_batch_norm() -> None:
    """vgg16 on 8×8 digits ends at a 1×1 map: one sample was torch's ValueError traceback."""
    with pytest.raises(GradwireError, match=r"trace: --batch-size 1 is too small for vgg16: .* "
                       r"needs 2 samples or more"):
        record("vgg16", iterations=1, batch_size=1, warmup=0)


# ---------------------------------------------------------------- measure (gradwire profile)


def test_measure_leaves_out_frozen_and_empty_parameters(partly_trained: str) -> None:
    """A frozen parameter was torch's RuntimeError (a hook on a tensor that needs no gradient);
    an empty one a 0-element row the profile parser refuses."""
    p = measure(partly_trained, batch_size=4, iters=1, warmup=0)
    assert [n for n, _ in p.params] == ["fc.bias", "fc.weight"]
    assert profiles.parse(p.to_text(), "measured") == p


def test_measure_of_a_model_with_nothing_to_train_is_one_line(all_frozen: str) -> None:
    with pytest.raises(GradwireError, match="profile: model 'all-frozen' has no parameter"):
        measure(all_frozen, batch_size=2, iters=1, warmup=0)


def test_measure_refuses_a_batch_too_small_for_batch_norm() -> None:
    with pytest.raises(GradwireError, match="profile: --batch-size 1 is too small for resnet50"):
        measure("resnet50", batch_size=1, iters=1, warmup=0)


# ---------------------------------------------------------------- profiles


def test_layer_times_summing_past_the_time_bound_are_refused() -> None:
    """Without backward_s, the layers' sum is backward_s: it was taken past the 1e6 s bound a
    given backward_s is held to."""
    doc = {"format": 1, "model": "toy", "forward_s": 0.01, "backward_s": None,
           "params": [["b", 10], ["w", 100]], "backward_layer_s": [1e6, 1e6]}
    with pytest.raises(GradwireError, match=r"toy.json: field 'backward_layer_s' must be a list "
                       r"summing to at most 1e\+06 seconds .*got '2e\+06 s'"):
        profiles.parse(json.dumps(doc), "toy.json")
    doc["backward_layer_s"] = [5e5, 5e5]
    assert profiles.parse(json.dumps(doc), "toy.json").backward_s == 1e6


def test_unknown_architecture_is_one_line() -> None:
    for f in (architectures.backward_order, architectures.backward_shapes):
        with pytest.raises(GradwireError, match=r"unknown architecture 'resnet18' \(did you "
                           r"mean 'resnet[0-9]+'\?\): expected one of resnet20"):
            f("resnet18")


# ---------------------------------------------------------------- models and data


@pytest.mark.parametrize("classes", [0, -1])
def test_build_model_refuses_no_classes(classes: int) -> None:
    """0 classes built a model with an empty output layer; -1 was torch's RuntimeError."""
    with pytest.raises(GradwireError, match=f"build_model: classes must be an integer >= 1, "
                       f"got {classes}"):
        build_model("mlp-small", 0, classes)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seq_len": 0}, "text: seq_len must be an integer >= 1, got 0"),
    ({"seq_len": -1}, "text: seq_len must be an integer >= 1, got -1"),
    ({"budget": 0}, "text: budget must be an integer >= 1, got 0"),
])
def test_text_refuses_empty_windows_and_budgets(kwargs: dict, message: str) -> None:
    """Were a ZeroDivisionError, a RuntimeError and an IndexError."""
    with pytest.raises(GradwireError, match=message):
        text(**kwargs)
