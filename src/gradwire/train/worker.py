"""One rank of a data-parallel training run; start it under ``gradwire run`` or ``torchrun``.

    gradwire run --hosts 4 --bandwidth 1gbit -- python -m gradwire.train.worker --epochs 5

Rank 0 prints ``GW_PROGRESS done total`` lines (the CLI turns them into a progress bar) and
writes the run's result as JSON to ``--out``; with ``--checkpoint`` it saves one after every
epoch, and ``--resume`` goes on from it as if the run had not stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gradwire import config
from gradwire.data import shard_indices
from gradwire.errors import GradwireError, PeerError
from gradwire.hooks import MODES
from gradwire.hooks.comm import host_group
from gradwire.interrupts import Interrupted, on_signals
from gradwire.jsonfile import check_writable, dumps, replace_text
from gradwire.launcher import PROGRESS
from gradwire.models import build_model, get_spec, num_parameters
from gradwire.models.task import Task, evaluate, load_task, loss_fn, optimizer
from gradwire.rendezvous import JOIN_S, join_world, whole_env
from gradwire.train import checkpoint
from gradwire.train.aggregate import METHODS, HookedDDP
from gradwire.train.job import TrainConfig, validate
from gradwire.train.wire import tx_bytes
from gradwire.transport import Pending, collective_error, peer_error

# Per-epoch sums kept in the history, in the order they are all-reduced.
SUMMED = ("loss_sum", "compute", "compress", "communicate", "header", "tail", "step", "sent",
          "wire", "cpu", "cpu_main", "cpu_hook")
# 1 for an epoch that a process began with (the run's first, and a resume's), else 0: each pays
# the one-time costs that the throughput figures leave out
STARTED = "started"
# The slowest write a checkpoint save may make and still count as making progress, in bytes
# per second: the ranks that wait for rank 0's save allow --timeout plus one second per MiB
# it writes (a network share or a busy disk can be slower than --timeout per file).
SAVE_RATE_FLOOR = 2**20
# What a rank that did not answer one of the worker's own collectives in time may have done:
# they wait the process group's timeout: --timeout, GRADWIRE_TIMEOUT where it is not given.
LATE = "stalled or its link is down (the worker's --timeout or GRADWIRE_TIMEOUT sets the limit)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # argparse, not typer: this module is the rank-side entry point torchrun starts directly.
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--agg", default="dense", choices=METHODS)
    p.add_argument("--density", type=float, default=0.001, help="sparsifiers' kept fraction")
    p.add_argument("--mode", default="bucket", choices=MODES)
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="dense-to-sparse density warm-up over the first epochs")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per iteration")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=64, help="text models: symbols per sample")
    p.add_argument("--rank", type=int, default=None,
                   help="PowerSGD's rank (--agg powersgd; default: the hook's)")
    p.add_argument("--checkpoint", default=None, help="rank 0 saves one here after every epoch")
    p.add_argument("--resume", action="store_true", help="go on from --checkpoint")
    p.add_argument("--out", default=None, help="rank 0 writes the result JSON here")
    p.add_argument("--timeout", type=float, default=None,
                   help="collective timeout, seconds (default: GRADWIRE_TIMEOUT, 60)")
    p.add_argument("--join-timeout", type=float, default=JOIN_S,
                   help=f"seconds the ranks get to join the run (default {JOIN_S:g}; "
                   "--timeout where longer)")
    a = p.parse_args(argv)
    # every check gradwire train makes on the host, made here too (this entry point also runs
    # under plain torchrun): each rank refuses bad input in one line before the process group,
    # instead of a traceback (an optimizer's, numpy's, batch norm's) or a file that cannot be
    # written once the run is over
    cfg = TrainConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(TrainConfig)})
    try:
        # the checkpoint --resume goes on from, read and checked here, before the join
        a.resumed = validate(cfg, world_size())
        check_writable(a.out, "--out")
        check_writable(a.checkpoint, "--checkpoint")
        _check_distinct_files(a.out, a.checkpoint)
        # the hooks' calls, and the launcher's wait for the others once one rank has failed,
        # follow GRADWIRE_TIMEOUT: the worker's own collectives do too unless told otherwise
        a.timeout = config.timeout() if a.timeout is None else config.check_timeout(
            "--timeout", a.timeout)
        config.check_timeout("--join-timeout", a.join_timeout)
    except GradwireError as e:
        p.error(str(e))
    return a


def world_size() -> int:
    """The ranks of this run as the launcher's WORLD_SIZE gives them (1 where it is unset), in
    one line where it is no whole number >= 1: int() of it ended in a ValueError traceback, 0
    in a ZeroDivisionError one."""
    world = whole_env("WORLD_SIZE", 1, None, "the number of ranks")
    return 1 if world is None else world


def _check_distinct_files(out: str | None, ck: str | None) -> None:
    """--out and --checkpoint are two files: the result, written last, replaced the
    checkpoint, and a resume then found no checkpoint there."""
    if out is None or ck is None:
        return
    same = os.path.realpath(out) == os.path.realpath(ck)
    with contextlib.suppress(OSError):  # either not there yet: the names tell
        same = same or os.path.samefile(out, ck)
    if same:
        raise GradwireError(f"--out and --checkpoint name the same file, {out!r}: the result "
                            "would replace the checkpoint; write them to two files")


def settings(args: argparse.Namespace, world: int) -> dict[str, Any]:
    keys = ("model", "agg", "density", "mode", "warmup", "batch_size", "lr", "momentum", "seed",
            "seq_len", "rank")
    return {**{k: getattr(args, k) for k in keys}, "world_size": world}


def train_epoch(fwd: nn.Module, agg: HookedDDP, opt: torch.optim.Optimizer, task: Task,
                idx: torch.Tensor, batch: int, progress: tuple[int, int] | None) -> list[float]:
    """One epoch over this rank's ``idx``; returns this rank's sums in SUMMED order."""
    before = dict(agg.stats)
    t = {"compute": 0.0, "step": 0.0}
    loss_sum = 0.0
    tx0 = tx_bytes()
    cpu0 = time.process_time()  # every thread of this rank: autograd, the hook's, gloo's
    main0 = time.thread_time()  # this thread only: forward, backward, DDP's buckets, the step
    for it in range(len(idx) // batch):
        x, y = task.batch(task.train, idx[it * batch : (it + 1) * batch])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(fwd(x), y)
        loss.backward()  # returns once the hook has written every bucket's average
        t1 = time.perf_counter()
        opt.step()
        t["compute"] += t1 - t0
        t["step"] += time.perf_counter() - t1
        loss_sum += loss.item()
        if progress is not None:
            done, total = progress
            print(f"{PROGRESS} {done + it + 1} {total}", flush=True)
    cpu = time.process_time() - cpu0
    cpu_main = time.thread_time() - main0
    tx1 = tx_bytes()
    d = {k: agg.stats[k] - before[k]
         for k in ("compress", "communicate", "header", "tail", "sent", "cpu")}
    # The hook compresses and communicates on its own thread while backward goes on; backward
    # waits only for the tail, so compute is forward + backward less the tail.
    compute = max(t["compute"] - d["tail"], 0.0)
    wire = -1.0 if tx0 is None or tx1 is None else float(tx1 - tx0)
    return [loss_sum, compute, d["compress"], d["communicate"], d["header"], d["tail"],
            t["step"], float(d["sent"]), wire, cpu, cpu_main, d["cpu"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # What takes each rank its own time (the data, the model, and the checkpoint it resumes
    # from, read by parse_args) comes before the join, within the join's limit: after it,
    # DDP's set-up and the start's barrier wait for every rank within the collective limit,
    # which a short GRADWIRE_TIMEOUT made too short for a rank slowed by a busy machine or a
    # slow file system.
    prepared = prepare(args)
    # ranks that start a few seconds apart are not a stall, however short --timeout is
    join_world("gloo", args.timeout, prog="gradwire train",
               join=max(args.timeout, args.join_timeout))
    result = train(args, prepared)
    # train() has returned, so the DDP model and the hook's thread, which hold the process
    # group, are gone before it is destroyed (destroyed under them, gloo can abort at exit).
    gc.collect()
    if result is not None and args.out:
        try:
            with _signals_end_the_write():
                replace_text(args.out, dumps(result, indent=1))  # strict JSON: NaN is null
        except OSError as e:  # checked before the run; a disk can still fill
            raise GradwireError(f"cannot write --out {args.out!r}: {e.strerror or e}") from None
    dist.destroy_process_group()
    return 0


def prepare(args: argparse.Namespace) -> tuple[Task, nn.Module]:
    """The rank's data and model, as ``args`` say; the same on every rank."""
    task = load_task(get_spec(args.model), args.seed, args.seq_len)
    return task, build_model(args.model, args.seed, task.classes)


def train(args: argparse.Namespace,
          prepared: tuple[Task, nn.Module] | None = None) -> dict[str, Any] | None:
    """Train as ``args`` say, from ``prepared`` (:func:`prepare`'s, made here if None) and,
    with --resume, the checkpoint :func:`parse_args` read; rank 0 returns the result
    (:func:`summarize`), the others None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    task, model = prepare(args) if prepared is None else prepared
    opt = optimizer(model.parameters(), args.lr, args.momentum)
    n_local = len(task.train) // world
    iters = n_local // args.batch_size
    assert iters > 0, "parse_args' validate() refuses a batch larger than a rank's share"
    agg = HookedDDP(args.agg, args.density, args.mode, args.warmup, args.seed, iters,
                    {} if args.rank is None else {"rank": args.rank})
    with _collective("collective", "DDP's set-up of the model", args.timeout):
        fwd = agg.start(model)  # DDP checks the model on every rank and broadcasts rank 0's
    run_settings = settings(args, world)
    # what a checkpoint keeps and a resume must match: the settings and the data trained on
    kept = run_settings | checkpoint.data_settings(task) if args.checkpoint else run_settings
    history: dict[str, list[float]] = {k: [] for k in (*SUMMED, *checkpoint.CURVES, STARTED)}
    first = 0
    # taken from args, so that no copy of the model and its momentum outlives the load;
    # parse_args' validate() checked it against this run's settings, data and model
    ck, args.resumed = args.resumed, None
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        agg.load_state_dict(ck["aggregation"][rank])
        history, first = ck["history"], ck["epoch"]
        for k in SUMMED:  # a checkpoint written before a counter existed: 0 for its epochs
            history.setdefault(k, [0.0] * first)
        history.setdefault(STARTED, [1.0] + [0.0] * (first - 1))  # written before it was kept
    del ck
    total = iters * (args.epochs - first)
    with _collective("barrier", "the start of training", args.timeout):
        dist.barrier()
    for epoch in range(first, args.epochs):
        agg.set_epoch(epoch)  # the hook counts epochs from its steps; this keeps it exact
        density = agg.density  # what this epoch's iterations use
        idx = shard_indices(len(task.train), rank, world, epoch, args.seed)
        # Every rank has finished the last epoch's evaluation: on shared cores, a rank still
        # evaluating would otherwise slow the others' first iterations, which count.
        with _collective("barrier", f"the start of epoch {epoch + 1}", args.timeout):
            dist.barrier()
        t0 = time.perf_counter()
        progress = (iters * (epoch - first), total) if rank == 0 else None
        # DDP's forward broadcasts rank 0's buffers (batch norm's) and, once, its bucket order;
        # the hook's own calls end in its errors, which pass unchanged
        with _collective("collective", f"epoch {epoch + 1}'s training", args.timeout):
            sums = torch.tensor(train_epoch(fwd, agg, opt, task, idx, args.batch_size,
                                            progress), dtype=torch.float64)
        seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        wire_ok = torch.tensor([float(sums[SUMMED.index("wire")] >= 0)])
        with _collective("all_reduce", f"the epoch's sums after epoch {epoch + 1}",
                         args.timeout):
            dist.all_reduce(sums)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            dist.all_reduce(wire_ok, op=dist.ReduceOp.MIN)
        test_loss, test_acc = evaluate(model, task.test)
        for k, v in zip(SUMMED, (sums / world).tolist(), strict=True):
            history[k].append(v if k != "wire" or wire_ok.item() else None)
        history["seconds"].append(seconds.item())
        history[STARTED].append(float(epoch == first))
        history["iterations"].append(iters)
        history["density"].append(density)
        history["train_loss"].append(sums[0].item() / (world * iters))
        history["test_loss"].append(test_loss)
        history["test_accuracy"].append(test_acc)
        if args.checkpoint:
            save_checkpoint(args.checkpoint, model, opt, agg, history, epoch + 1, kept,
                            args.timeout)
    return summarize(args, run_settings, model, task, history) if rank == 0 else None


def save_checkpoint(path: str, model: nn.Module, opt: torch.optim.Optimizer, agg: HookedDDP,
                    history: dict, epoch: int, run_settings: dict[str, Any],
                    timeout: float | None = None) -> None:
    """Every rank hands its aggregation state to rank 0, which writes the file and then tells
    every other rank whether it did; a failed write ends every rank (exit 1).

    The others wait for that word up to :func:`save_wait` seconds: ``timeout`` (the
    collective timeout; default GRADWIRE_TIMEOUT) plus one second per MiB of checkpoint, so
    that a slow disk does not end a healthy run. A rank that exits meanwhile is found at once
    (its connection closes), one that stalls within that bound (``timeout`` while the states
    are gathered); either ends in a one-line :class:`PeerError`."""
    timeout = config.timeout() if timeout is None else timeout
    rank, world = dist.get_rank(), dist.get_world_size()
    states: list[Any] | None = [None] * world if rank == 0 else None
    mine = agg.state_dict()
    with _collective("gather_object", "the checkpoint save", timeout):
        dist.gather_object(mine, states, dst=0)
    failed = torch.zeros(1)
    if rank == 0:
        try:
            with _signals_end_the_write():
                checkpoint.save(path, {"epoch": epoch, "settings": run_settings,
                                       "model": model.state_dict(),
                                       "optimizer": opt.state_dict(),
                                       "aggregation": states, "history": history})
        except (OSError, RuntimeError) as e:  # torch.save says RuntimeError for a lost folder
            print(f"gradwire train: error: cannot write checkpoint {path!r} after epoch "
                  f"{epoch}: {e}", file=sys.stderr, flush=True)
            failed += 1
        _share_outcome(failed, timeout, path)  # the others wait already
    else:
        nbytes = tensor_bytes([model.state_dict(), opt.state_dict()]) + world * tensor_bytes(mine)
        _share_outcome(failed, save_wait(timeout, nbytes), path)
    if failed.item():  # every rank stops, none waits on a peer that has gone
        raise SystemExit(1)


def save_wait(timeout: float, nbytes: int) -> float:
    """Seconds a rank waits for rank 0 to write a checkpoint of about ``nbytes`` bytes:
    ``timeout`` plus ``nbytes`` at SAVE_RATE_FLOOR."""
    return timeout + nbytes / SAVE_RATE_FLOOR


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (dicts, lists and tuples walked): about what a
    checkpoint of it takes on disk."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _share_outcome(failed: torch.Tensor, wait_s: float, path: str) -> None:
    """Rank 0 sends ``failed`` to every other rank, which receives it; each wait ends within
    ``wait_s`` seconds. Point to point on a gloo group: a wait of gloo's takes a limit of its
    own, longer than the group's (NCCL's limit, and a gloo collective's, is the group's)."""
    group = host_group(None)
    rank = dist.get_rank()
    op = "send" if rank == 0 else "recv"
    late = (f"stalled writing checkpoint {path!r} (a rank waits the collective timeout plus "
            "1 s per MiB of checkpoint)")
    posted = []
    try:
        for peer in range(1, dist.get_world_size()) if rank == 0 else [0]:
            try:
                work = (dist.isend(failed, dst=peer, group=group) if rank == 0
                        else dist.irecv(failed, src=peer, group=group))
            except RuntimeError as e:  # gloo raises at once where the peer's connection closed
                raise peer_error(rank, op, peer, 4, str(e), wait_s, late) from None
            posted.append(Pending(work, op, peer, 4, rank, wait_s,
                                  late if peer == 0 else "stalled"))
        for pending in posted:
            pending.wait()
    except PeerError as e:
        raise e.within("the checkpoint save") from None


@contextlib.contextmanager
def _collective(op: str, during: str, timeout: float) -> Iterator[None]:
    """Run the block, whose collectives over the world wait at most ``timeout`` seconds (the
    process group's); where gloo fails in it (a peer exited, stalled or lost its link), end
    the rank in one line saying ``during`` which step of the worker, and the peer where it
    is known (:func:`~gradwire.transport.collective_error`), instead of gloo's traceback.
    Any other error passes unchanged: the hook's (one line already, naming its peer) and this
    rank's own faults."""
    try:
        yield
    except RuntimeError as e:
        if not _from_gloo(e):
            raise
        raise collective_error(dist.get_rank(), dist.get_world_size(), op, str(e), timeout,
                               during, LATE) from None


def _from_gloo(e: RuntimeError) -> bool:
    """Whether ``e`` is torch.distributed's or gloo's: c10d raises gloo's errors as plain
    RuntimeErrors whose text names gloo's source file (``[.../gloo/transport/tcp/pair.cc:553]
    Connection closed by peer ...``)."""
    return isinstance(e, dist.DistError) or "gloo" in str(e).lower()


def _stopped(signum: int) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_end_the_write() -> Iterator[None]:
    """While rank 0 writes a file: SIGTERM (how a launcher stops the ranks), SIGINT, SIGHUP
    and SIGQUIT unwind the write, which removes its temporary file, and then end the rank as
    they would have (their default action). Left to that default from the start, they ended
    the process at once, and a ``.NAME.PID.tmp`` as large as the checkpoint stayed beside it.
    (Not a SystemExit: the interpreter's exit under a live gloo process group can abort.)"""
    try:
        with on_signals(_stopped):
            yield
    except Interrupted as e:
        signal.signal(e.signum, signal.SIG_DFL)
        signal.raise_signal(e.signum)
        os._exit(128 + e.signum)  # a signal whose default does not end the process: none here


def summarize(args: argparse.Namespace, run_settings: dict[str, Any], model: nn.Module,
              task: Task, history: dict[str, list]) -> dict[str, Any]:
    """The result file: settings, the per-epoch curves, and throughput, bytes and time per
    iteration over the *steady* epochs, those at the final density (all of them for methods
    that do not sparsify; after the warm-up for those that do, whose first epochs send up to
    250 times more), less each epoch a process began with (the run's first, and a resumed
    run's first) when others remain: it pays one-time costs (connections, first allocations,
    DDP's bucket rebuild; an mlp run at P = 2 took 16.8 ms per iteration in it, 13.5 in the
    next). ``wall_s`` and ``samples_per_s_overall`` cover every epoch."""
    world = run_settings["world_size"]
    steady = [i for i, d in enumerate(history["density"]) if d == history["density"][-1]]
    warm = [i for i in steady if not history[STARTED][i]]
    steady = warm or steady

    def total(key: str, epochs: list[int]) -> float:
        return sum(history[key][i] for i in epochs)

    iters = total("iterations", steady)
    wire = [history["wire"][i] for i in steady]
    wall = list(itertools.accumulate(history["seconds"]))
    samples = args.batch_size * world
    return {
        **run_settings,
        "parameters": num_parameters(model),
        "data": task.kind,
        "network": os.environ.get("GRADWIRE_NETWORK", "unknown (not launched by gradwire)"),
        "epochs": len(history["iterations"]),
        "iterations": sum(history["iterations"]),
        "steady_epochs": len(steady),
        "batch_size_per_rank": args.batch_size,
        "samples_per_s": iters * samples / total("seconds", steady),
        "samples_per_s_overall": sum(history["iterations"]) * samples / wall[-1],
        "seconds_per_iter": {k: total(k, steady) / iters for k in (
            "compute", "compress", "communicate", "header", "tail", "step")},
        # CPU seconds one rank's process used per iteration, all its threads (mean of ranks)
        "cpu_s_per_iter": total("cpu", steady) / iters,
        # the part of it on the training thread: forward, backward (with DDP's bucket copies;
        # it only waits for the hook), the optimizer step; not the hook's coding or collectives
        "cpu_main_s_per_iter": total("cpu_main", steady) / iters,
        # the hook's thread: coding and its calls' own work (the rest is gloo's threads)
        "cpu_hook_s_per_iter": total("cpu_hook", steady) / iters,
        "wire_tx_bytes_per_iter_per_rank": (None if any(w is None for w in wire)
                                            else sum(wire) / iters),
        "payload_bytes_per_iter_per_rank": total("sent", steady) / iters,
        "density_per_epoch": history["density"],
        "loss": history["train_loss"],
        "test_loss": history["test_loss"],
        "test_accuracy": history["test_accuracy"],
        "epoch_wall_s": wall,
        "wall_s": wall[-1],
        "parameter_checksum": float(sum(p.detach().double().abs().sum()
                                        for p in model.parameters())),
    }


def _main() -> int:
    """:func:`main`, with a gradwire error (a lost peer, a mismatched call) as one line."""
    try:
        return main()
    except GradwireError as e:
        print(f"gradwire train: error: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_main())
