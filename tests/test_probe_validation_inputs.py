"""Calibration probes and the performance validation on synthetic measurements: what a probe
measures is in the unit the model charges it back in, and bad inputs are one line. No
cluster and no process group: the collectives are stand-ins."""
import copy
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import one_line_raised
from test_perf_validation_script import CALIBRATION, PROFILE

from gradwire.bench import validation as pv
from gradwire.collectives import probe
from gradwire.perf import comm


def _fake_world(monkeypatch, p: int, cpu_per_call: float):
    """``p`` identical ranks in this process: each gradwire allreduce spends ``cpu_per_call``
    CPU seconds; the process group's calls are stand-ins (an all_reduce sums ``p`` equal
    values)."""
    def spend(*args, **kwargs):
        c0 = time.process_time()
        while time.process_time() - c0 < cpu_per_call:
            pass

    monkeypatch.setattr(probe, "all_reduce", spend)
    monkeypatch.setattr(probe, "dist", SimpleNamespace(
        barrier=lambda group=None: None, broadcast=lambda t, src, group=None: None,
        all_reduce=lambda t, group=None: t.mul_(p), get_global_rank=lambda g, r: r))
    return SimpleNamespace(world_size=p, device=torch.device("cpu"), group=None,
                           reset_counters=lambda: None)


@pytest.mark.parametrize("p", [3, 5])
def test_the_cpu_per_step_is_per_step_a_rank_takes_part_in(monkeypatch, p):
    """The model charges ``cpu_step`` per step a rank takes part in
    (:func:`gradwire.perf.comm.cpu_seconds`); the probe divided a call's CPU by the
    schedule's steps. Recursive doubling at P = 3 has 3 steps, a rank takes part in 2: the
    CPU of a call came back as 2/3 of what it spent (P = 5: 60 %)."""
    spent = 5e-4
    t = _fake_world(monkeypatch, p, spent)
    _, cpu = probe.step_times(t, "rd")
    charged = comm.cpu_seconds("allreduce", "rd", p, p, 4, cpu, 0.0)
    assert charged == pytest.approx(spent, rel=0.15)


# ---- the validation's predictions from a result given to --repredict


def _result(aggs: list[str]) -> dict:
    """A validation result at 1 Gbit/s, P = 2, each method measured 10 ms."""
    preds = pv.predict_configuration(PROFILE, CALIBRATION, "1gbit", 2, aggs, 0.001, 4)
    rows = pv.rows("1gbit", 2, preds, {a: {"iteration_s": 0.01} for a in aggs})
    return {"model": "toy", "density": 0.001, "rank": 4, "cores": 2, "profile": PROFILE,
            "clusters": [{"bandwidth": "1gbit", "workers": 2, "calibration": CALIBRATION}],
            "rows": rows}


@pytest.mark.parametrize("agg", [" dense", "dense,topk", ""])
def test_a_row_of_no_method_s_name_is_one_line(agg):
    """advise's comma list stripped " dense" and split "dense,topk" into two methods, so
    the prediction came back under other names: a KeyError in rows()."""
    doc = _result(["dense", "topk"])
    doc["rows"][0]["agg"] = agg
    one_line_raised(lambda: pv.repredict(doc), "1gbit P = 2", f"unknown method {agg!r}")


def test_a_method_the_codec_table_lacks_is_named_by_its_configuration():
    """Not by the temporary file that carried the calibration to advise's reader (gone when
    the error shows), nor with advice to give --codecs, an option of advise's."""
    cal = copy.deepcopy(CALIBRATION)
    del cal["codecs"]["methods"]["topk"]
    text = one_line_raised(lambda: pv.predict_configuration(PROFILE, cal, "1gbit", 2,
                                                      ["dense", "topk"], 0.001, 4),
                     "the calibration of 1gbit, P = 2", "topk")
    assert "gradwire-validation-" not in text and "--codecs" not in text
