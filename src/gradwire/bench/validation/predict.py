"""The model's side of the validation: each configuration predicted from that cluster's
calibration file and the model's profile alone, as ``gradwire advise --calibration F --model
PROFILE`` predicts it, plus β and the links' token bucket. Nothing a training run measured
goes in: :func:`predict_configuration` is never given one."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from gradwire import profiles
from gradwire.catalogue import METHODS
from gradwire.catalogue.paths import DENSE
from gradwire.cluster.shaping import tbf_burst
from gradwire.errors import GradwireError, did_you_mean
from gradwire.perf import advise, scenario
from gradwire.perf.calibration import Calibration
from gradwire.perf.calibration import parse as parse_calibration
from gradwire.perf.model import ClusterModel, Prediction, parse_link


def link_terms(cluster: ClusterModel, cal: Calibration, rate: str) -> ClusterModel:
    """``cluster`` with the calibration's β and the token bucket the emulated cluster shapes
    its links with (how it is configured, not a measurement of a run): what ``advise`` takes
    from the link rate instead."""
    return dataclasses.replace(cluster, beta=cal.beta_s_per_byte,
                               burst=float(tbf_burst(parse_link(rate))))


def predict_configuration(profile: dict, calibration: dict, rate: str, workers: int,
                          aggs: list[str], density: float, rank: int
                          ) -> dict[str, Prediction]:
    """Each method of ``aggs`` predicted on ``workers`` ranks with links of ``rate``, from
    ``profile`` (a profile file's JSON) and ``calibration`` (a calibration file's JSON) alone.

    Both are read back from files through :mod:`gradwire.perf.scenario`, the path of
    ``gradwire advise --calibration``: α, γ, κ, the coding slowdown (None below 1), the
    shared-CPU terms and the codec table all come from there, so the validation tests what
    a user of advise gets. Then β and the token bucket (:func:`link_terms`), and
    :func:`gradwire.perf.advise.rank` at compute speedup 1.

    Example::

        preds = predict_configuration(doc["profile"], cal, "1gbit", 2, ["dense", "topk"],
                                      0.001, 4)
        float(preds["topk"].iteration)
    """
    # checked first under names of their own: scenario's readers would name the temporary
    # files that carry them there, gone by the time the error shows
    if not isinstance(calibration, dict):
        raise GradwireError(f"the calibration of {rate}, P = {workers} must be an object, got "
                            f"{type(calibration).__name__}")
    where = f"the calibration of {rate}, P = {workers}"
    parsed = parse_calibration(calibration, where)
    profiles.parse(json.dumps(profile), "the validation's profile")
    # each a method's name, as a result's rows name them: advise's comma list would split
    # "dense,topk" and strip " dense", and no prediction would be keyed by the name asked for
    for agg in aggs:
        if agg not in METHODS:
            raise GradwireError(f"{rate} P = {workers}: unknown method {agg!r}"
                                f"{did_you_mean(agg, METHODS)}: expected one of "
                                f"{', '.join(METHODS)}")
    # advise's ranking would leave them out naming the temporary file and --codecs
    lacking = [a for a in aggs if a not in parsed.codecs.methods and METHODS[a].path is not DENSE]
    if lacking:
        raise GradwireError(f"{where}: its codec table has no encode/decode time for "
                            f"{', '.join(lacking)} (it has {', '.join(parsed.codecs.methods)})")
    with tempfile.TemporaryDirectory(prefix="gradwire-validation-") as tmp:
        prof_file, cal_file = Path(tmp, "profile.json"), Path(tmp, "calibration.json")
        prof_file.write_text(json.dumps(profile))
        cal_file.write_text(json.dumps(calibration))
        s = scenario.Scenario(model=str(prof_file), agg=",".join(aggs), density=density,
                              rank=rank, calibration=cal_file)
        scenario.check_terms(s)
        cal = scenario.read_calibration(s)
        prof, schemes, table = scenario.inputs(s, cal)
        terms, _ = scenario.setting(s, cal)
    assert cal is not None
    cluster = link_terms(terms.cluster(workers, parse_link(rate)), cal, rate)
    ranked, skipped = advise.rank(prof, cluster, schemes, table, 1.0, terms.overlap_slowdown)
    if skipped:
        raise GradwireError(f"the model cannot predict {rate}, P = {workers}: "
                            + "; ".join(skipped))
    return {r.agg.method: r.prediction for r in ranked}


def parts(pred: Prediction) -> dict[str, float]:
    """A prediction's parts, in seconds per iteration (``cpu_*``: CPU seconds; ``calls``,
    ``steps`` and ``buckets``: counts per iteration)."""
    return {"forward": pred.forward, "backward": pred.backward, "step": pred.step,
            "coding": pred.coding, "communicate": float(pred.communicate),
            "header": float(pred.header), "exposed": float(pred.exposed),
            "cpu_per_rank": pred.cpu, "cpu_communicate": pred.cpu_comm,
            "cpu_bound": float(pred.cpu_bound), "device_bound": float(pred.device_bound),
            "calls": pred.calls, "steps": pred.steps, "buckets": pred.buckets}


def rows(rate: str, workers: int, predicted: dict[str, Prediction],
         measured: dict[str, dict]) -> list[dict]:
    """One row per measured method of one configuration: the prediction beside the median
    run (:func:`~.runs.median_run`)."""
    out = []
    for agg, res in measured.items():
        pred = predicted[agg]
        meas = res["iteration_s"]
        out.append({
            "bandwidth": rate, "workers": workers, "agg": agg,
            "measured_s": meas, "predicted_s": float(pred.iteration),
            "error": float(pred.iteration) / meas - 1,
            "predicted_parts_s": parts(pred), "measured": res})
    return out


def repredict(doc: dict) -> list[dict]:
    """Every row of the result ``doc`` predicted again from the profile and calibrations it
    recorded, with the model as it is now; each row keeps its measurement. A row whose
    configuration has no cluster record (so no calibration to predict it from) is an error:
    dropped, the summary would cover fewer configurations than were measured."""
    # a configuration recorded twice, or a method measured twice in one, is a damaged result:
    # its rows would be predicted and summarised twice, or one measurement dropped unseen
    seen: set[tuple] = set()
    for c in doc["clusters"]:
        key = (c["bandwidth"], c["workers"])
        if key in seen:
            raise GradwireError(f"{key[0]} P = {key[1]} has two cluster records (one "
                                "calibration each): which predicts its rows is unclear")
        seen.add(key)
    seen = set()
    for r in doc["rows"]:
        key = (r["bandwidth"], r["workers"], r["agg"])
        if key in seen:
            raise GradwireError(f"{key[0]} P = {key[1]} has two rows of {key[2]}: a method is "
                                "measured once per configuration (its median run)")
        seen.add(key)
    kept = {(c["bandwidth"], c["workers"]) for c in doc["clusters"]}
    orphans = [k for k in dict.fromkeys((r["bandwidth"], r["workers"]) for r in doc["rows"])
               if k not in kept]
    if orphans:
        raise GradwireError("rows of " + ", ".join(f"{b} P = {p}" for b, p in orphans)
                            + " have no cluster record (its calibration): they cannot be "
                            "predicted again")
    out = []
    for c in doc["clusters"]:
        measured = {r["agg"]: r["measured"] for r in doc["rows"]
                    if (r["bandwidth"], r["workers"]) == (c["bandwidth"], c["workers"])}
        if not measured:
            continue
        preds = predict_configuration(doc["profile"], c["calibration"], c["bandwidth"],
                                      c["workers"], list(measured), doc["density"],
                                      doc["rank"])
        out += rows(c["bandwidth"], c["workers"], preds, measured)
    return out

