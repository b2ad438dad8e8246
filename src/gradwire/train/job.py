"""A training run as the CLI and the demo start it: checked settings, the worker's arguments,
and the launch on a cluster. Every check here runs before a cluster is built, so bad input
leaves nothing behind."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from gradwire import catalogue
from gradwire.check import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_SEED,
    MAX_SEQ_LEN,
    check_density,
    check_range,
)
from gradwire.cluster import Cluster
from gradwire.errors import GradwireError, did_you_mean
from gradwire.hooks import MODES
from gradwire.hooks.warmup import Warmup
from gradwire.jobs import run_ranks
from gradwire.models import MODELS, build_model, check_batch, get_spec
from gradwire.models.task import Task, load_task
from gradwire.train.aggregate import METHODS, HookedDDP, check_rank


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run's ranks are started with (defaults: the worker's)."""

    model: str = "mlp"
    agg: str = "dense"
    density: float = 0.001
    mode: str = "bucket"
    warmup: bool = True
    epochs: int = 10
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    seq_len: int = 64
    rank: int | None = None  # PowerSGD's rank; None: the hook's default
    checkpoint: Path | None = None
    resume: bool = False

    def worker_args(self) -> list[str]:
        """The ``python -m gradwire.train.worker`` arguments for this run."""
        args = ["--model", self.model, "--agg", self.agg, "--density", repr(self.density),
                "--mode", self.mode, "--warmup" if self.warmup else "--no-warmup",
                "--epochs", str(self.epochs), "--batch-size", str(self.batch_size),
                "--lr", repr(self.lr), "--momentum", repr(self.momentum),
                "--seed", str(self.seed), "--seq-len", str(self.seq_len)]
        if self.rank is not None:
            args += ["--rank", str(self.rank)]
        if self.checkpoint is not None:  # one word: a name such as "-ck.pt" stays a value
            args.append(f"--checkpoint={self.checkpoint}")
        if self.resume:
            args.append("--resume")
        return args


def warmup_note(cfg: TrainConfig, fix: str) -> str | None:
    """One line for a run whose epochs all fall in its method's warm-up, so that it never
    sends the density asked for; None otherwise. ``fix``: what the command offers instead,
    ``{epochs}`` in it the first run length that does send it."""
    if not cfg.warmup or not catalogue.get(cfg.agg).takes_density:
        return None
    schedule = Warmup()  # the hooks' own: what the run's hook will send
    warm = sum(schedule.density(e, cfg.density) > cfg.density
               for e in range(len(schedule.densities)))
    if cfg.epochs > warm:
        return None
    last = schedule.density(cfg.epochs - 1, cfg.density)
    run = "1 epoch ends" if cfg.epochs == 1 else f"{cfg.epochs} epochs end"
    lasts = "1 epoch" if warm == 1 else f"{warm} epochs"
    return (f"{cfg.agg}'s warm-up lasts {lasts}, so {run} at density {last:g}, never "
            f"{cfg.density:g}: {fix.format(epochs=warm + 1)}")


def validate(cfg: TrainConfig, hosts: int) -> dict[str, Any] | None:
    """One-line GradwireErrors for every setting a run would fail on, before anything starts;
    with --resume, the checkpoint read and checked (None without)."""
    if cfg.model not in MODELS:
        raise GradwireError(f"unknown model {cfg.model!r}{did_you_mean(cfg.model, MODELS)}: "
                            f"expected one of {', '.join(MODELS)}")
    if "," in cfg.agg:
        raise GradwireError(f"--agg takes one method per training run, got {cfg.agg!r}: to "
                            f"compare several in one table, gradwire demo --agg {cfg.agg}")
    if cfg.agg not in METHODS:
        raise GradwireError(f"unknown aggregation {cfg.agg!r}{did_you_mean(cfg.agg, METHODS)}: "
                            f"expected one of {', '.join(METHODS)}")
    if cfg.mode not in MODES:
        raise GradwireError(f"--mode {cfg.mode!r} is not valid: expected one of "
                            f"{', '.join(MODES)}")
    check_density(cfg.density)
    if cfg.epochs < 1:
        raise GradwireError(f"--epochs must be >= 1, got {cfg.epochs}")
    if cfg.epochs > MAX_EPOCHS:
        raise GradwireError(f"--epochs must be at most {MAX_EPOCHS}, got {cfg.epochs}")
    check_range("--batch-size", cfg.batch_size, 1, MAX_BATCH)
    check_range("--seq-len", cfg.seq_len, 1, MAX_SEQ_LEN)
    check_range("--seed", cfg.seed, 0, MAX_SEED)
    if not 0 < cfg.lr < math.inf:
        raise GradwireError(f"--lr must be a finite number > 0, got {cfg.lr:g}")
    if not 0 <= cfg.momentum < 1:
        raise GradwireError(f"--momentum must be in [0, 1), got {cfg.momentum:g}")
    check_rank(cfg.agg, cfg.rank)
    check_batch(cfg.model, cfg.batch_size)
    task = load_task(get_spec(cfg.model), cfg.seed, cfg.seq_len)
    share = len(task.train) // hosts
    if cfg.batch_size > share:
        raise GradwireError(f"--batch-size {cfg.batch_size} is larger than a rank's share of "
                            f"{cfg.model}'s training data ({share} samples at {hosts} hosts)")
    if cfg.resume:
        return _check_resume(cfg, hosts, task)
    if cfg.checkpoint is not None and (os.path.lexists(cfg.checkpoint)
                                       and not os.path.isdir(cfg.checkpoint)):
        # (a folder is refused as an output, by name)
        raise GradwireError(f"--checkpoint {str(cfg.checkpoint)!r} exists, and a new run "
                            f"would replace it after its first epoch: --resume goes on from "
                            f"it; to start afresh, give another path or remove it")
    return None


def _check_resume(cfg: TrainConfig, hosts: int, task: Task) -> dict[str, Any]:
    """The checkpoint, once its settings, data and state are checked to be this run's: here,
    before any rank starts (a model of another vocabulary would fail in every rank's
    load_state_dict)."""
    from gradwire.train import checkpoint

    if cfg.checkpoint is None:
        raise GradwireError("--resume needs --checkpoint PATH (the file to go on from)")
    ck = checkpoint.load(cfg.checkpoint)
    settings = asdict(cfg) | {"world_size": hosts} | checkpoint.data_settings(task)
    checkpoint.check_compatible(ck, settings, cfg.epochs)
    checkpoint.check_state(ck, build_model(cfg.model, cfg.seed, task.classes))
    iters = len(task.train) // hosts // cfg.batch_size  # as each rank counts its steps
    options = {} if cfg.rank is None else {"rank": cfg.rank}
    checkpoint.check_hook_states(ck, lambda: HookedDDP(cfg.agg, cfg.density, cfg.mode,
                                                       cfg.warmup, cfg.seed, iters, options))
    return ck


def train_on(cluster: Cluster, cfg: TrainConfig, label: str, timeout: float | None,
             console: Console) -> dict[str, Any]:
    """Run the worker once per host and return rank 0's result."""
    result = run_ranks(cluster, "gradwire.train.worker", cfg.worker_args(), label, timeout,
                       console)
    if not isinstance(result, dict):
        kind = ("null" if result is None else "array" if isinstance(result, list)
                else "string" if isinstance(result, str) else "number or boolean")
        raise GradwireError(f"{label} failed: rank 0's result is a JSON {kind}, expected an "
                            "object of the run's figures")
    return result
