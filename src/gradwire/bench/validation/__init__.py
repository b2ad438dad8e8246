"""The performance model against measured training on the emulated cluster.

Steps (``benchmarks/perf_validation.py`` runs them):

1. Profile: the MLP's forward, per-tensor backward and optimizer step, measured once in this
   process on one thread (as each rank computes), before any run (:func:`~.runs.profile`).
2. For each link rate and P, an emulated cluster, and on it first ``gradwire calibrate``
   (CPU ranks over gloo; codecs timed on the MLP's bucket at the training's density and
   rank): a format-2 calibration file.
3. Prediction of every method there from that calibration and the profile alone, as
   ``gradwire advise --calibration F --model PROFILE`` predicts it, with the calibration's β
   and the links' token bucket (:func:`~.predict.predict_configuration`). It is made before
   the cluster's training runs; no training run's measurement goes in.
4. Measurement: ``gradwire train`` of every method (batch 32 per rank, no density warm-up,
   DDP's default buckets), ``repeats`` runs each (``fast_repeats``, if given, where the
   prediction is under ``FAST_S``), the rounds interleaved; a row's measured iteration is its
   median run's seconds per iteration over the steady epochs (the first epoch left out),
   each run long enough for ``STEADY_S`` of them at the predicted time.
5. Summary (:func:`~.summary.summarise`): per row measured, predicted and error; median and
   max |error| for uncontended configurations (P ≤ the machine's cores) and contended ones
   apart; the advisor (the model's first-ranked method per configuration) scored by the
   share of configurations where its pick measures within 5 % of the fastest and by the mean
   of pick / fastest, beside "always dense", "always fp16" and "always topk".

The result keeps every input of the predictions (the profile, each cluster's calibration),
so ``--repredict`` predicts it again with the model as it is now. Its fields: the command,
date, machine and commit; ``profile``; ``clusters`` (per rate and P: ``calibration``,
``epochs`` and ``runs`` per method); ``rows`` (``measured_s``, ``predicted_s``, ``error``,
``predicted_parts_s``, and ``measured``: every run's iteration, the median run's parts, the
CPU per rank); ``summary``.
"""

from gradwire.bench.validation.predict import predict_configuration, repredict, rows
from gradwire.bench.validation.report import load_result, write_report
from gradwire.bench.validation.runs import (
    EPOCHS,
    FAST_S,
    MAX_EPOCHS,
    STEADY_S,
    Plan,
    epochs_for,
    median_run,
    parse_plan,
    repeats_for,
    run,
)
from gradwire.bench.validation.summary import advisor, errors, lines, plot, score, summarise

__all__ = [
    "EPOCHS", "FAST_S", "MAX_EPOCHS", "STEADY_S", "Plan", "advisor", "epochs_for", "errors",
    "lines", "load_result", "median_run", "parse_plan", "plot", "predict_configuration",
    "repeats_for", "repredict", "rows", "run", "score", "summarise", "write_report",
]
