"""Performance model against measured training on the emulated cluster.

For each link rate and P, one emulated cluster first runs ``gradwire calibrate``'s rank side
(α per step of a P-element allreduce with every rank taking part, β by streaming, γ, and the
CPU a rank spends per step and per byte, how many ranks share how many cores, the share of
them the ranks keep busy, what each collective call waits for ranks not yet scheduled and
how much slower memory-bound CPU work runs beside the other ranks),
then ``gradwire train`` (the project's 1.13 M parameter MLP, batch 32 per rank, no density
warm-up, DDP's default buckets) ``--repeats`` times per aggregation, or ``--fast-repeats``
times where the model guesses an iteration under ``FAST_S`` (short runs: more of them cost
little), the rounds interleaved (every aggregation once, then again), and the median run kept
(one run in three that the machine slowed, as it does here by up to 40 %, no longer moves the
row; two in five with ``--fast-repeats``); the model predicts the same configuration:

- compute: forward + backward as the *other aggregations' runs at the same P and rate*
  report it (the median of theirs; ``others_compute``), split into forward and per-tensor
  backward as ``gradwire profile`` measures them in one process; the optimizer step the same
  way. No row is predicted from its own compute (until 2026-11-26 15:30 every row took the
  dense run's, whose backward runs beside its long transfers);
- network: that cluster's α per step, β and γ; every bucket pays the call-header exchange;
  each link's token bucket (the cluster's ``tc tbf``, point 7 of ``gradwire.perf.model``):
  a bucket's data calls start with what the link earned idle before them;
- stragglers (point 6): the time the dense run's ranks waited at the header exchanges beyond
  what the model charges for them, per iteration, added to every aggregation's;
- encode/decode: a codec table measured here before the runs, one thread (as each rank runs),
  through the hook's own path on the model's number of elements (``codec_probe.measure``);
- shared CPU (point 5 of ``gradwire.perf.model``): P ranks on this machine's cores. Before
  the runs, calibrate measures on the cluster the CPU per iteration of every aggregation's
  hook (its own path: error feedback, encode, the call header, the collectives, decode) on
  the model's buckets, all ranks at once, the methods in turn (``hook_s``; ``--hook-*`` of
  ``gradwire.bench.calibrate``); after the runs it measures them again (``--hooks-only``,
  kept as ``hook_s_after``), and a row takes the mean of the two, since the machine's speed
  drifts while the runs go on (in the run of 2026-11-26 16:03 it slowed by 15 % after the
  calibrations, and the compressed rows at 1 Gbit/s, P = 2 came out 10-17 % fast).
  ``--cpu hooks`` (the default since 2026-11-26 15:30) takes
  that as each row's coding and collective CPU, and a rank's CPU besides them as its
  training thread's, the median over the other aggregations' runs at this P on both rates
  (``thread_cpu``: no row is predicted from its own measurement). ``--cpu dense`` (the
  default before) takes a rank's CPU besides coding and communication from each dense run
  at this P (one per link rate): its measured CPU per rank (the median of its runs) less the
  model's coding and communication CPU for it on its own cluster, the mean over the rates
  (``own_cpu``); every aggregation adds its own coding and communication. Re-pricing the
  runs of 13:01 and 13:49 with the model of 15:30 gave a max of 15.3 % and 15.2 % with
  hooks, 21.7 % and 22.6 % with dense (docs/benchmarks.md).
  The same probes' wall time per iteration (the mean of the two) floors each row (point 8
  of ``gradwire.perf.model``): forward + the hooks' wall + step;
  Each row also keeps the parts of its measured CPU on the training thread and on the hook's
  (``measured_main_cpu_s_per_rank``, ``measured_hook_cpu_s_per_rank``; the rest is gloo's
  threads; ``benchmarks/cpu_split.py`` has why);
- overlap slowdown κ = 1 (not fitted).

So the other aggregations' runs supply compute and the training thread's CPU, the dense run
the ranks' spread and calibrate each hook's CPU; no row is predicted from its own
measurement. Measured iteration = P·batch / samples per
second over the steady epochs (the first epoch, which pays one-time costs, is left out); each
run has enough epochs for at least ``STEADY_S`` of steady training at the iteration time the
model guesses before the runs (``epochs_for``; the result keeps them under "epochs"). The
advisor's pick at each (rate, P) is the scheme with the lowest prediction among those
measured.

:mod:`.runs` sizes and runs the trainings, :mod:`.predict` predicts each row and
:mod:`.summary` summarises, merges and draws; ``benchmarks/perf_validation.py`` runs it all:

    flock /tmp/gradwire-bench.lock python benchmarks/perf_validation.py   # about 65 minutes
    python benchmarks/perf_validation.py --rates 1gbit --workers 2 --aggs dense,fp16 --out v.json
"""

from gradwire.bench.validation.predict import (
    CPU_ESTIMATES,
    cluster_of,
    guess,
    hook_cpu,
    others_compute,
    own_cpu,
    predict_all,
    predict_rows,
    recorded_inputs,
    recorded_measurements,
    reference,
    thread_cpu,
    with_compute_of,
)
from gradwire.bench.validation.runs import (
    CPU_KEYS,
    EPOCHS,
    FAST_S,
    MAX_EPOCHS,
    STEADY_S,
    codec_table,
    epochs_for,
    hook_args,
    median_run,
    one_thread,
    repeats_for,
    run,
    write_report,
)
from gradwire.bench.validation.summary import merge, plot, repredict, summarise

__all__ = [
    "CPU_ESTIMATES", "CPU_KEYS", "EPOCHS", "FAST_S", "MAX_EPOCHS", "STEADY_S", "cluster_of",
    "codec_table", "epochs_for", "guess", "hook_args", "hook_cpu", "median_run", "merge",
    "one_thread", "others_compute", "own_cpu", "plot", "predict_all", "predict_rows",
    "recorded_inputs", "recorded_measurements", "reference", "repeats_for", "repredict", "run",
    "summarise", "thread_cpu", "with_compute_of", "write_report",
]
