"""Record a compute trace from a real PyTorch training iteration (``gradwire trace``).

Forward: a pre-hook on every module that owns parameters stamps when the forward pass first
uses them. Backward: a post-accumulate-grad hook on every parameter stamps when its gradient
is ready. Times are relative to the start of each pass; the first ``warmup`` iterations are
run but not kept (allocator and kernel warm-up). A frozen (``requires_grad=False``) or empty
parameter sends no gradient, so the trace leaves it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import accumulate

import torch
from torch import nn

from gradwire.check import MAX_RECORDED, is_int
from gradwire.errors import GradwireError
from gradwire.models import build_model, check_batch, get_spec, trained_parameters
from gradwire.models.task import load_task, loss_fn
from gradwire.sim.trace import Iteration, Param, Trace


def record(model_name: str, iterations: int = 3, batch_size: int = 32, warmup: int = 1,
           seed: int = 0, worker: int = 0,
           on_step: Callable[[int, int], object] | None = None) -> Trace:
    """Train ``model_name`` on its data set for ``warmup + iterations`` SGD steps, timing each;
    ``on_step(done, total)`` after each (progress)."""
    # whole numbers (a float failed in range() with a traceback, True passed for 1), the
    # iterations kept as many as a trace may hold, the worker as loads() reads it back
    if not (is_int(iterations, 1, MAX_RECORDED) and is_int(batch_size, 1)
            and is_int(warmup, 0, MAX_RECORDED) and is_int(worker, 0)):
        raise GradwireError(f"trace needs whole numbers: iterations from 1 to {MAX_RECORDED}, "
                            f"batch size >= 1, warmup from 0 to {MAX_RECORDED} and worker >= 0, "
                            f"got {iterations!r}, {batch_size!r}, {warmup!r}, {worker!r}")
    spec = get_spec(model_name)
    check_batch(model_name, batch_size, "trace: --batch-size")
    task = load_task(spec, seed)
    model = build_model(model_name, seed, task.classes)
    trained = trained_parameters(model, model_name, "trace")
    names = {id(p): n for n, p in trained}
    stamps: dict[int, float] = {}
    first_use: dict[int, float] = {}
    handles = []

    def pre(module: nn.Module, _inputs: object) -> None:
        now = time.perf_counter()
        for p in module.parameters(recurse=False):
            first_use.setdefault(id(p), now)

    for m in model.modules():
        if any(True for _ in m.parameters(recurse=False)):
            handles.append(m.register_forward_pre_hook(pre))
    for _, p in trained:
        handles.append(p.register_post_accumulate_grad_hook(
            lambda q: stamps.__setitem__(id(q), time.perf_counter())))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    order: list[int] = []
    kept: list[tuple[float, dict[int, float], float, dict[int, float]]] = []
    try:
        for step in range(warmup + iterations):
            idx = torch.randint(len(task.train), (batch_size,), generator=g)
            x, y = task.batch(task.train, idx)
            stamps.clear()
            first_use.clear()
            opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            t1 = time.perf_counter()
            loss.backward()
            opt.step()
            if not order:
                order = sorted((i for i in first_use if i in names), key=first_use.__getitem__)
                order += [i for i in names if i not in first_use]
            if step >= warmup:
                kept.append((t0, dict(first_use), t1, dict(stamps)))
            if on_step is not None:
                on_step(step + 1, warmup + iterations)
    finally:
        for h in handles:
            h.remove()
    by_id = {id(p): p for p in model.parameters()}
    params = tuple(Param(names[i], by_id[i].numel() * by_id[i].element_size(),
                         tuple(by_id[i].shape)) for i in order)
    its = []
    for k, (t0, fwd, t1, bwd) in enumerate(kept):
        f = [max(fwd.get(i, t1) - t0, 0.0) for i in order]
        f = list(accumulate(f, max))  # forward order: never decreasing
        b = [max(bwd.get(i, t1) - t1, 0.0) for i in order]
        its.append(Iteration(worker, k, t1 - t0, tuple(f), tuple(b)))
    return Trace(model_name, params, tuple(its),
                 f"gradwire trace --model {model_name} --batch-size {batch_size} "
                 f"(torch {torch.__version__}, CPU, {torch.get_num_threads()} threads)",
                 {"batch_size": batch_size})
