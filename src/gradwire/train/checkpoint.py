"""Checkpoints that let a run stop after any epoch and go on as if it had not stopped.

One file (loaded with `weights_only=True`: tensors, numbers, strings and containers only)
holds the model, the optimizer (momentum buffers), every rank's aggregation state
(error-feedback residuals differ per rank, so all of them are kept, in rank order), the epoch
history, and the settings a resumed run must share (model, aggregation, density, mode, warm-up,
world size, batch size, learning rate and momentum (the optimizer's state holds them), seed,
sequence length, PowerSGD's rank) and the data it trained on (:func:`data_settings`: the text
models read this Python's own standard library, which another Python version has other bytes
of). Rank 0 writes it after each epoch, atomically, with a digest of everything it holds:
torch's zip reader checks no checksum, so a flipped bit in a tensor (a damaged disk, a copy
cut and patched) loaded silently as other weights, momentum or residuals; such a file is
refused.
"""

from __future__ import annotations

import hashlib
import os
import platform
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradwire import catalogue
from gradwire.errors import GradwireError
from gradwire.jsonfile import written_to
from gradwire.models import get_spec
from gradwire.models.task import Task, optimizer

FORMAT = 1
# Where a checkpoint keeps digest() of the rest (absent from one written before it was kept)
DIGEST = "digest"
# Settings that must match for a resumed run to continue the same run.
MUST_MATCH = ("model", "agg", "density", "mode", "warmup", "world_size", "batch_size", "lr",
              "momentum", "seed", "seq_len", "rank")
# The data's (data_settings), which must match too; a checkpoint written before they were kept
# has none, and the shapes of its model's tensors are checked instead (check_state).
DATA_KEYS = ("classes", "data")
# The history's curves, one entry per epoch, that every checkpoint holds; the worker's per-epoch
# sums (its SUMMED) may be missing from one written before they were kept.
CURVES = ("seconds", "train_loss", "test_loss", "test_accuracy", "iterations", "density")


def data_settings(task: Task) -> dict[str, Any]:
    """What a resumed run's data must share with the checkpoint's: the classes (the text's
    vocabulary size) and a digest of every sample; and the Python that read them, which the
    error names (the text is that Python's standard library source)."""
    digest = hashlib.sha256()
    for split in (task.train, task.test):
        for t in (split.x, split.y):
            digest.update(t.contiguous().numpy().tobytes())
    return {"classes": task.classes, "data": f"{task.kind} sha256:{digest.hexdigest()[:16]}",
            "python": platform.python_version()}


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` through a temporary file, so a crash leaves the old one; a
    link to a file stays a link, its file replaced (:func:`~gradwire.jsonfile.written_to`).
    The file holds a digest of ``state`` (:func:`digest`), which :func:`load` checks."""
    body = {k: v for k, v in state.items() if k not in ("format", DIGEST)}
    with written_to(Path(path)) as tmp:
        torch.save({"format": FORMAT, **body, DIGEST: digest(body)}, tmp)


def digest(obj: Any) -> str:
    """sha256 of ``obj``'s contents: every tensor's dtype, shape and bytes, every other value's
    type and repr, dicts (in order) and lists walked; what torch.load gives back of what
    torch.save wrote has the same digest."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{list(obj.shape)}:".encode())
        h.update(t.view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}:".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, list | tuple):
        h.update(f"{type(obj).__name__}{len(obj)}:".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def load(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint written by :func:`save`; anything else is a one-line GradwireError."""
    try:
        # a pipe would be waited on for ever, a device read without end
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise GradwireError(f"--resume: {str(path)!r} is not a regular file (a directory, "
                                "a pipe or a device): give the checkpoint file")
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise GradwireError(f"--resume: checkpoint {str(path)!r} does not exist") from e
    except GradwireError:
        raise
    except OSError as e:  # unreadable (permissions, a folder in the path that is a file)
        raise GradwireError(f"--resume: cannot read checkpoint {str(path)!r}: "
                            f"{e.strerror or e}") from e
    except Exception as e:  # torch raises many kinds of error for a file that is not one
        raise GradwireError(f"--resume: {str(path)!r} is not a gradwire checkpoint "
                            f"({type(e).__name__})") from e
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise GradwireError(f"--resume: {str(path)!r} is not a gradwire checkpoint "
                            f"(format {FORMAT})")
    if DIGEST in ck:
        body = {k: v for k, v in ck.items() if k not in ("format", DIGEST)}
        if ck[DIGEST] != digest(body):
            raise GradwireError(f"--resume: {str(path)!r} is damaged: its contents do not "
                                "match the digest it was written with (a changed or corrupt "
                                "file); resume from an intact copy")
    kinds = {"settings": dict, "epoch": int, "model": dict, "optimizer": dict,
             "aggregation": list, "history": dict}
    for key, kind in kinds.items():
        if not isinstance(ck.get(key), kind) or isinstance(ck.get(key), bool):
            raise GradwireError(f"--resume: {str(path)!r} is not a whole gradwire checkpoint: "
                                f"its {key!r} is {type(ck.get(key)).__name__}, expected "
                                f"{kind.__name__}")
    if ck["epoch"] < 1:  # save() is called after an epoch, never before the first
        raise GradwireError(f"--resume: {str(path)!r} is not a whole gradwire checkpoint: its "
                            f"epoch is {ck['epoch']}, expected >= 1")
    return ck


def effective(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` as the run uses them: density and warm-up None for a method that takes no
    density, the rank None but for PowerSGD, whose rank left out is its default, and the
    sequence length None but for a model that reads text."""
    out = dict(settings)
    try:
        method = catalogue.get(out.get("agg"))
        data = get_spec(out.get("model")).data
    except (GradwireError, TypeError):
        return out  # not a run's: compared as it is, and refused by name
    if not method.takes_density:
        out["density"] = out["warmup"] = None
    if "rank" not in method.options:
        out["rank"] = None
    elif out.get("rank") is None:
        out["rank"] = method.make_compressor().params["rank"]
    if data != "text":
        out["seq_len"] = None
    return out


def check_compatible(ck: dict[str, Any], settings: dict[str, Any], epochs: int) -> None:
    """Refuse to resume into a run whose settings or data differ, or that has no epoch left;
    settings the run does not use (:func:`effective`) may differ."""
    saved, settings = effective(ck["settings"]), effective(settings)
    for key in (*MUST_MATCH, *DATA_KEYS):
        if key in DATA_KEYS and key not in saved:
            continue
        if saved.get(key) != settings.get(key):
            why = ""
            if key in DATA_KEYS:
                made, runs = saved.get("python"), settings.get("python")
                why = (f" (its data were read under Python {made}, this run's under {runs}: "
                       f"the text models read the standard library of the Python they run "
                       f"under; resume under Python {made})" if made != runs else
                       " (its data differ from this run's)")
            raise GradwireError(f"--resume: the checkpoint was made with {key}="
                                f"{saved.get(key)!r}, this run has {settings.get(key)!r}{why}")
    if ck["epoch"] >= epochs:
        raise GradwireError(f"--resume: the checkpoint already holds {ck['epoch']} epochs; "
                            f"expected --epochs > {ck['epoch']}, got {epochs}")


def check_state(ck: dict[str, Any], model: nn.Module) -> None:
    """Refuse a checkpoint whose state cannot go into this run: a model tensor missing or of
    another shape (made on other data: an older checkpoint keeps no digest of them), not one
    aggregation state per rank, an optimizer state that does not fit the model, or a history
    without one entry per epoch."""
    have = model.state_dict()
    for name, t in have.items():
        got = ck["model"].get(name)
        if got is None:
            raise GradwireError(f"--resume: the checkpoint's model has no {name!r}, which this "
                                "run's model has (a checkpoint of another model)")
        if not isinstance(got, torch.Tensor) or got.shape != t.shape:
            shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise GradwireError(f"--resume: the checkpoint's {name!r} is {shape}, this run's "
                                f"model has {list(t.shape)} (a checkpoint of other data or of "
                                "another model)")
    extra = sorted(set(ck["model"]) - set(have))
    if extra:
        raise GradwireError(f"--resume: the checkpoint's model has {extra[0]!r}, which this "
                            "run's model has not (a checkpoint of another model)")
    world = ck["settings"].get("world_size")
    if len(ck["aggregation"]) != world:
        raise GradwireError(f"--resume: the checkpoint is not whole: it holds "
                            f"{len(ck['aggregation'])} ranks' aggregation states, expected "
                            f"{world} (its world_size)")
    _check_optimizer(ck["optimizer"], model)
    _check_history(ck["history"], ck["epoch"])


def check_hook_states(ck: dict[str, Any], fresh: Callable[[], Any]) -> None:
    """Each rank's aggregation state loads into ``fresh()``, a new hook state of this run's
    method and options (``load_state_dict`` refuses a malformed one): refused here, on the
    host, where each rank would have refused its own once the cluster had started."""
    for rank, state in enumerate(ck["aggregation"]):
        try:
            fresh().load_state_dict(state)
        except GradwireError as e:
            raise GradwireError(f"--resume: rank {rank}'s aggregation state in the checkpoint "
                                f"does not load: {e}") from None


def _check_optimizer(state: dict[str, Any], model: nn.Module) -> None:
    """``state`` loads into this run's optimizer and steps it: every rank would otherwise
    fail with torch's traceback, at the load or at the first step (a momentum buffer of
    another shape, a parameter group short of a hyperparameter)."""
    opt = optimizer(model.parameters(), 1.0, 0.0)  # a throwaway: lr and momentum come from state
    wanted = set(opt.param_groups[0])
    try:
        opt.load_state_dict(state)
    except (AttributeError, IndexError, KeyError, RuntimeError, TypeError, ValueError) as e:
        why = " ".join(str(e).split())
        raise GradwireError(f"--resume: the checkpoint's optimizer state does not fit this run's "
                            f"model ({type(e).__name__}: {why})") from None
    for group in opt.param_groups:
        missing = sorted(wanted - set(group))
        if missing:
            raise GradwireError(f"--resume: the checkpoint's optimizer state has a parameter "
                                f"group without {missing[0]!r}")
    for i, p in enumerate(model.parameters()):
        for name, value in opt.state.get(p, {}).items():
            if value is None:  # no buffer yet: SGD starts one at the next step
                continue
            if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                shape = (list(value.shape) if isinstance(value, torch.Tensor)
                         else type(value).__name__)
                raise GradwireError(f"--resume: the checkpoint's optimizer {name} of parameter "
                                    f"{i} is {shape}, this run's parameter has {list(p.shape)}")


def _check_history(history: dict[str, Any], epoch: int) -> None:
    """One number per epoch in each of the history's curves: the run appends its own epochs to
    them, and its result reads them side by side."""
    for key in CURVES:
        if key not in history:
            raise GradwireError(f"--resume: the checkpoint's history has no {key!r}")
    for key, values in history.items():
        if not isinstance(values, list) or len(values) != epoch:
            got = (f"{len(values)} entries" if isinstance(values, list)
                   else type(values).__name__)
            raise GradwireError(f"--resume: the checkpoint's history {key!r} holds {got}, "
                                f"expected one per epoch ({epoch})")
        for v in values:
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise GradwireError(f"--resume: the checkpoint's history {key!r} holds a "
                                    f"{type(v).__name__}, expected numbers")
