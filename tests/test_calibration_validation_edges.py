"""Calibration files and the performance validation's inputs and summary: bounds on the
slowdowns, the rank side's own errors and unsaved results, results given to --repredict, codec
tables of another dtype, the advisor's pick among equal predictions, the cores contended
configurations are counted against, and the figure's rows."""
import copy
import json
import os

import calibration_doc
import pytest
from conftest import one_line_raised

from gradwire.bench import calibrate
from gradwire.bench import validation as pv
from gradwire.bench.validation import runs
from gradwire.catalogue import METHODS
from gradwire.errors import GradwireError
from gradwire.perf import calibration, codecs

AGGS = ["dense", "topk"]
# A profile file's JSON: a 2-tensor model of 101 000 parameters, 6 ms of compute.
PROFILE = {
    "format": 1, "model": "toy", "description": "a test's", "batch_size": 32,
    "dtype": "float32", "forward_s": 2e-3, "backward_s": 4e-3, "step_s": 1e-3, "sources": {},
    "backward_layer_s": [1e-3, 3e-3],
    "params": [["fc.bias", 1000, [1000]], ["fc.weight", 100_000, [1000, 100]]]}


@pytest.fixture(scope="module")
def validation_result():
    """A validation result at 1 Gbit/s, P = 2 and 4, on a 2-core machine."""
    clusters, rows = [], []
    for p in (2, 4):
        cal = calibration_doc.doc(world=p, codecs=calibration_doc.codecs(tuple(AGGS), 101_000),
                                  cpu=calibration_doc.cpu(cpu_ranks_per_machine=p))
        clusters.append({"bandwidth": "1gbit", "workers": p, "calibration": cal})
        preds = pv.predict_configuration(PROFILE, cal, "1gbit", p, AGGS, 0.001, 4)
        rows += pv.rows("1gbit", p, preds, {a: {"iteration_s": 0.01 * (i + 1)}
                                            for i, a in enumerate(AGGS)})
    return {"model": "toy", "density": 0.001, "rank": 4, "cores": 2, "profile": PROFILE,
            "clusters": clusters, "rows": rows}


@pytest.mark.parametrize(("change", "field", "bound"), [
    ({"overlap_slowdown": 1e5}, "overlap_slowdown", "<= 100"),
    ({"coding_slowdown": 1e308}, "coding_slowdown", "<= 100"),
    ({"compute_slowdown": 1e308}, "compute_slowdown", "<= 1e+06"),
    ({"cpu": calibration_doc.cpu(cpu_slowdown=1e308)}, "cpu.cpu_slowdown", "<= 1e+06"),
    ({"alpha_s": 2.0}, "alpha_s", "<= 1"),
    ({"alpha_call_s": 3.0}, "alpha_call_s", "<= 2"),  # a call of 2 ranks is 2 steps
    ({"alpha_transport_s": 2.0}, "alpha_transport_s", "<= 1"),
    ({"gamma_s_per_byte": 1e-3}, "gamma_s_per_byte", "<= 1e-06"),
])
def test_a_calibration_s_terms_are_bounded_as_the_options_are(tmp_path, change, field, bound):
    """Each slowdown multiplies the profile's times: 1e308 made every prediction inf ("dense
    wins at inf ms"), where --overlap-slowdown stops at 100 and a compute speed-up at 1e-6.
    α and γ stop where --alpha-us and --gamma-ns do (the simulator refuses more)."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(calibration_doc.doc(**change)))
    one_line_raised(lambda: calibration.load(path), f"field '{field}' must be a number",
                    bound)
    # the bounds themselves are kept
    top = {"overlap_slowdown": 100, "coding_slowdown": 100, "compute_slowdown": 1e6,
           "cpu": calibration_doc.cpu(cpu_slowdown=1e6)}
    path.write_text(json.dumps(calibration_doc.doc(**top)))
    cal = calibration.load(path)
    assert (cal.overlap_slowdown, cal.compute_slowdown, cal.cpu.cpu_slowdown) == (100, 1e6, 1e6)


def _rank_side(monkeypatch, tmp_path, failure: Exception) -> str:
    """The rank side's main() (rank 0) whose run fails with ``failure``; its exit message."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)

    def fail(*_args, **_kw):
        raise failure

    monkeypatch.setattr(calibrate, "run", fail)
    with pytest.raises(SystemExit) as e:
        calibrate.main(["--out", str(tmp_path / "cal.json"), "--model", "resnet20",
                        "--device", "cpu"])
    text = str(e.value.code)
    assert text.startswith("python -m gradwire.bench.calibrate: error: ") and "\n" not in text
    return text


def test_the_rank_side_keeps_a_calibration_it_could_not_save(monkeypatch, tmp_path):
    """A full disk at the end of minutes of measurement: the calibration goes to a new file
    and the error says where, as gradwire calibrate's own does; no traceback."""
    doc = calibration_doc.doc(codecs=calibration_doc.codecs(tuple(METHODS)))
    cal = calibration.parse(doc, "test")
    text = _rank_side(monkeypatch, tmp_path, calibrate.Unsaved(
        cal, tmp_path / "cal.json", OSError(28, "No space left on device")))
    assert "No space left on device" in text and "result saved to " in text
    saved = text.split("result saved to ")[1]
    assert calibration.load(saved).to_json() == cal.to_json()


def test_the_rank_side_reports_a_failed_measurement_in_one_line(monkeypatch, tmp_path):
    text = _rank_side(monkeypatch, tmp_path, GradwireError("rank 1 is gone"))
    assert text.endswith("rank 1 is gone")


def test_repredict_refuses_rows_without_a_cluster_record(validation_result):
    """Their configuration's calibration is gone: dropped quietly, the summary would cover
    half the configurations measured."""
    doc = copy.deepcopy(validation_result)
    doc["clusters"] = doc["clusters"][:1]
    one_line_raised(lambda: pv.repredict(doc), "1gbit P = 4", "no cluster record")


def test_a_bad_calibration_in_a_result_is_named_by_its_configuration(validation_result):
    """Not by the temporary file that carried it to the model's reader, gone by then."""
    doc = copy.deepcopy(validation_result)
    del doc["clusters"][1]["calibration"]["alpha_s"]
    text = one_line_raised(lambda: pv.repredict(doc), "the calibration of 1gbit, P = 4",
                           "field 'alpha_s' is missing")
    assert "gradwire-validation-" not in text
    doc = copy.deepcopy(validation_result)
    doc["profile"]["forward_s"] = -1
    text = one_line_raised(lambda: pv.repredict(doc), "the validation's profile",
                           "'forward_s'")
    assert "gradwire-validation-" not in text


@pytest.mark.parametrize(("damage", "field"), [
    (lambda d: d["rows"][0].pop("measured"), "rows[0].measured"),
    (lambda d: d["rows"][1]["measured"].update(iteration_s=0), "rows[1].measured.iteration_s"),
    (lambda d: d["clusters"][1].update(workers="4"), "clusters[1].workers"),
    (lambda d: d["clusters"][0].pop("calibration"), "clusters[0].calibration"),
    (lambda d: d.update(rows={}), "rows"),
    (lambda d: d.update(cores=0), "cores"),
])
def test_repredict_refuses_a_damaged_result_in_one_line(tmp_path, validation_result, damage,
                                                        field):
    """A KeyError or a division by zero half way through, before."""
    doc = copy.deepcopy(validation_result)
    damage(doc)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    one_line_raised(lambda: pv.load_result(path), f"--repredict {path}: field {field!r} must")


@pytest.mark.parametrize("workers", ["1_6", "\u0662,4"])
def test_workers_are_whole_numbers_in_ascii_digits(workers):
    """int() reads "1_6" as 16 and "٢" as 2: a typo ran a cluster nobody asked for."""
    one_line_raised(lambda: pv.parse_plan("1gbit", workers, "dense"), "--workers",
                    "expected a comma list of whole numbers")
    assert pv.parse_plan("1gbit", " 2, 4", "dense").workers == [2, 4]


def row(p: int, agg: str, measured_s: float, predicted_s: float, rate: str = "1gbit") -> dict:
    return {"bandwidth": rate, "workers": p, "agg": agg, "measured_s": measured_s,
            "predicted_s": predicted_s, "error": predicted_s / measured_s - 1}


def test_equal_predictions_advise_what_advise_ranks_first_not_the_first_measured():
    """advise ranks equal predictions in the catalogue's order, dense first; the summary
    took the first row of the configuration, so the same prediction scored the advisor by
    whichever method --aggs listed first."""
    for aggs in (["topk", "dense"], ["dense", "topk"]):
        times = {"dense": 0.020, "topk": 0.030}
        rows = [row(2, a, times[a], 0.02) for a in aggs]
        s = pv.summarise({"rows": rows, "cores": 2})
        assert s["picks"][0]["advised"] == "dense", aggs
        assert s["advisor"] == pytest.approx({"within_5pct": 1.0, "mean_ratio": 1.0})
    # a strictly faster prediction still wins whatever the catalogue's order
    rows = [row(2, "dense", 0.020, 0.021), row(2, "topk", 0.030, 0.02)]
    assert pv.summarise({"rows": rows, "cores": 2})["picks"][0]["advised"] == "topk"


def test_a_result_counts_the_cores_its_ranks_may_run_on(monkeypatch):
    """The summary's contended configurations are P > cores. The ranks inherit this
    process's affinity, as gradwire bench counts them (usable_cores); os.cpu_count() counts
    the machine's, so 4 ranks confined to 2 cores were summarised as uncontended."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runs, "netns_available", lambda: (True, ""))

    class Prof:
        def to_json(self) -> dict:
            return PROFILE

        def to_text(self) -> str:
            return json.dumps(PROFILE)

    monkeypatch.setattr(runs, "profile", lambda batch: Prof())
    monkeypatch.setattr(runs, "one_cluster", lambda *a, **k: (
        {"bandwidth": "1gbit", "workers": 4}, {}, {}))
    doc = runs.run(pv.Plan(["1gbit"], [4], ["dense"], repeats=1), console=None)
    assert doc["cores"] == 2
    assert pv.summarise({"rows": [row(4, "dense", 0.1, 0.1)], "cores": doc["cores"]})[
        "contended"]["rows"] == 1


def test_repredict_refuses_a_configuration_recorded_twice(validation_result):
    """Two cluster records of one (rate, P) predicted its rows twice: every row of it
    counted twice in the median errors and the advisor's score."""
    doc = copy.deepcopy(validation_result)
    doc["clusters"].append(copy.deepcopy(doc["clusters"][0]))
    one_line_raised(lambda: pv.repredict(doc), "1gbit P = 2", "two cluster records")
    assert len(pv.repredict(validation_result)) == len(validation_result["rows"])


def test_repredict_refuses_a_method_measured_twice_in_one_configuration(validation_result):
    """One of the two rows was dropped without a word (a dict keyed by method)."""
    doc = copy.deepcopy(validation_result)
    twin = copy.deepcopy(doc["rows"][1])
    twin["measured"] = {"iteration_s": 0.5}
    doc["rows"].append(twin)
    one_line_raised(lambda: pv.repredict(doc), f"P = {twin['workers']}",
                    f"two rows of {twin['agg']}")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", "float16", "field 'dtype' must be 'float32'"),
    ("source", 7, "field 'source' must be text"),
])
def test_a_codec_table_of_other_elements_is_refused_in_one_line(tmp_path, field, value,
                                                                message):
    """Its times are per fp32 element: a table measured on fp16 elements was read as if
    fp32 (a calibration's reader refuses it), and a source that is no text was made one."""
    table = calibration_doc.codecs(("dense", "topk"))
    path = tmp_path / "codecs.json"
    path.write_text(json.dumps(table | {field: value}))
    one_line_raised(lambda: codecs.load(str(path)), message)
    path.write_text(json.dumps({"codecs": table | {field: value}}))  # in a calibration file
    one_line_raised(lambda: codecs.load(str(path)), message)
    path.write_text(json.dumps(table))
    assert codecs.load(str(path)).source == "a test's"
    for name in codecs.BUILTIN:
        assert codecs.load(name).numel > 0


def test_the_figure_shows_every_rate_s_rows(monkeypatch, tmp_path):
    """One marker per link rate from five: the rows of a sixth rate were left out of the
    figure without a word (zip stopped at the last marker)."""
    from gradwire.bench.validation import summary

    figures = []

    def keep(fig, path, dpi):
        figures.append(fig)

    monkeypatch.setattr(summary, "save_figure", keep)
    rates = ["100gbit", "10gbit", "1gbit", "500mbit", "100mbit", "10mbit"]
    rows = [row(2, "dense", 0.01 * (i + 1), 0.012 * (i + 1), r) for i, r in enumerate(rates)]
    doc = {"rows": rows, "cores": 2, "model": "toy"}
    doc["summary"] = pv.summarise(doc)
    pv.plot(doc, tmp_path / "f.png")
    (ax,) = figures[0].axes
    from matplotlib.collections import PathCollection

    shown = sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
    assert shown == len(rows)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "dense, 10mbit" in labels
