"""Checkpoints that let a run stop after any epoch and go on as if it had not stopped.

One file (loaded with `weights_only=True`: tensors, numbers, strings and containers only)
holds the model, the optimizer (momentum buffers), every rank's aggregation state
(error-feedback residuals differ per rank, so all of them are kept, in rank order), the epoch
history, and the settings a resumed run must share (model, aggregation, density, mode, warm-up,
world size, batch size, learning rate and momentum (the optimizer's state holds them), seed,
sequence length, PowerSGD's rank). Rank 0 writes it after each
epoch, atomically.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from gradwire.errors import GradwireError
from gradwire.jsonfile import written_beside

FORMAT = 1
# Settings that must match for a resumed run to continue the same run.
MUST_MATCH = ("model", "agg", "density", "mode", "warmup", "world_size", "batch_size", "lr",
              "momentum", "seed", "seq_len", "rank")


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` through a temporary file, so a crash leaves the old one."""
    with written_beside(Path(path)) as tmp:
        torch.save({"format": FORMAT, **state}, tmp)


def load(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint written by :func:`save`; anything else is a one-line GradwireError."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise GradwireError(f"--resume: checkpoint {str(path)!r} does not exist") from e
    except Exception as e:  # torch raises many kinds of error for a file that is not one
        raise GradwireError(f"--resume: {str(path)!r} is not a gradwire checkpoint "
                            f"({type(e).__name__})") from e
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise GradwireError(f"--resume: {str(path)!r} is not a gradwire checkpoint "
                            f"(format {FORMAT})")
    kinds = {"settings": dict, "epoch": int, "model": dict, "optimizer": dict,
             "aggregation": list, "history": dict}
    for key, kind in kinds.items():
        if not isinstance(ck.get(key), kind) or isinstance(ck.get(key), bool):
            raise GradwireError(f"--resume: {str(path)!r} is not a whole gradwire checkpoint: "
                                f"its {key!r} is {type(ck.get(key)).__name__}, expected "
                                f"{kind.__name__}")
    return ck


def check_compatible(ck: dict[str, Any], settings: dict[str, Any], epochs: int) -> None:
    """Refuse to resume into a run whose settings differ, or that has no epoch left."""
    for key in MUST_MATCH:
        if ck["settings"].get(key) != settings.get(key):
            raise GradwireError(f"--resume: the checkpoint was made with {key}="
                                f"{ck['settings'].get(key)!r}, this run has {settings.get(key)!r}")
    if ck["epoch"] >= epochs:
        raise GradwireError(f"--resume: the checkpoint already holds {ck['epoch']} epochs; "
                            f"expected --epochs > {ck['epoch']}, got {epochs}")
