"""gradwire.perf called from Python: numpy worker counts, subnormal link rates, malformed dtype
γs, the what-if answers' inputs, check_calls and a given α's executor α."""

from __future__ import annotations

import numpy as np
import pytest

from gradwire import profiles
from gradwire.errors import GradwireError
from gradwire.perf import codecs, comm, whatif
from gradwire.perf.model import Aggregation, ClusterModel, predict


@pytest.fixture(scope="module")
def resnet50() -> profiles.Profile:
    return profiles.load("resnet50")


@pytest.mark.parametrize("method", ["dense", "gtopk"])
def test_a_numpy_worker_count_prices_as_the_same_python_int(resnet50, method) -> None:
    # np.arange sweeps hand numpy integers: ref_count and the gTop-k merge count called
    # .bit_length() on them (AttributeError)
    table = codecs.load("h100")
    agg = Aggregation(method)
    want = predict(resnet50, ClusterModel(6, 1e9, 5e-5), agg, table)
    got = predict(resnet50, ClusterModel(np.int64(6), 1e9, 5e-5), agg, table)
    assert float(got.iteration) == float(want.iteration)
    assert comm.ref_count(np.int64(6)) == comm.ref_count(6) == 24
    assert codecs.merges(np.int64(6)) == codecs.merges(6) == 3


@pytest.mark.parametrize("kw", [{"link_bps": 1e-310},
                                {"link_bps": np.array([1e9, 1e-310])},
                                {"link_bps": 1e9, "ranks_per_node": 2, "intra_bps": 1e-310}])
def test_a_subnormal_link_rate_is_one_line_not_nan(kw) -> None:
    # 8/rate overflows to inf: every prediction came out NaN (inf·0) without a word
    with pytest.raises(GradwireError, match="finite time") as e:
        ClusterModel(4, alpha=5e-5, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("entry", [("float16",), "float16", ("float16", 1e-10, 2)])
def test_a_malformed_gamma_dtype_entry_is_one_line(entry) -> None:
    with pytest.raises(GradwireError, match="gamma_dtype"):
        ClusterModel(4, 1e9, 5e-5, gamma_dtype=(entry,))  # type: ignore[arg-type]


@pytest.mark.parametrize("args, message", [
    ((0.0,), "compute speedup"),
    ((-1.0,), "compute speedup"),
    ((float("nan"),), "compute speedup"),
    ((1.0, float("nan")), "overlap slowdown"),
    ((1.0, 0.5), "overlap slowdown"),
])
def test_required_compression_checks_its_terms_as_predict_does(resnet50, args, message) -> None:
    # speedup 0 was a ZeroDivisionError, a negative one "inf" (no ratio fits), and a NaN κ
    # answered 1 (dense fits)
    with pytest.raises(GradwireError, match=message):
        whatif.required_compression(resnet50, ClusterModel(4, 1e9, 5e-5), *args)


def test_required_compression_of_a_profile_without_compute_is_one_line() -> None:
    # predict refuses it in one line; required_compression raised a TypeError (None · float)
    prof = profiles.load("resnet20")
    assert not prof.has_compute
    with pytest.raises(GradwireError, match="no compute times"):
        whatif.required_compression(prof, ClusterModel(4, 1e9, 5e-5), 1.0)


def test_check_calls_must_be_a_bool():
    """check_calls="no" priced the headers, as any non-empty text is true."""
    with pytest.raises(GradwireError, match="check_calls must be True or False, got 'no'"):
        ClusterModel(4, 1e9, 5e-5, 3e-12, check_calls="no")
    assert ClusterModel(4, 1e9, 5e-5, 3e-12, check_calls=np.bool_(False)).check_calls \
        is not True


def test_a_given_alpha_names_the_executor_alpha_it_moved(tmp_path):
    """With --alpha-us, the line saying where the terms came from gave the calibration's
    executor α, not the one priced (moved with the given α, keeping its extra)."""
    import json

    import calibration_doc

    from gradwire.perf import scenario

    path = tmp_path / "cal.json"
    path.write_text(json.dumps(calibration_doc.doc(alpha_s=2.5e-4, alpha_transport_s=4e-4)))
    terms, where = scenario.setting(scenario.Scenario(calibration=path, alpha_us=100.0))
    assert terms.alpha_transport == pytest.approx(2.5e-4)
    assert "given: α 100 µs (gradwire's executor 250 µs)" in where
