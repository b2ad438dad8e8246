"""``gradwire profile``: measure a project model's compute on this machine as a profile.

Per iteration: forward and loss (timed), backward with a hook on every parameter that stamps
when its gradient is accumulated (the order of the stamps *is* the backward order, and the gap
before each stamp is that tensor's backward compute), then an SGD-with-momentum step (timed).
Medians over the timed iterations, after untimed warm-up ones. Compute that runs beside
communication is slower than this (the model's ``overlap_slowdown``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

from gradwire.check import MAX_RECORDED, check_int, check_range
from gradwire.models import build_model, check_batch, get_spec, trained_parameters
from gradwire.models.task import load_task, loss_fn, optimizer
from gradwire.profiles import Profile


def measure(model: str, batch_size: int = 32, iters: int = 10, warmup: int = 3,
            seq_len: int = 64, seed: int = 0,
            on_step: Callable[[int, int], object] | None = None) -> Profile:
    """``model``'s profile from ``warmup`` untimed and ``iters`` timed iterations here;
    ``on_step(done, total)`` after each (progress)."""
    for param, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        check_int("profile", param, value, 1)
    # each iteration is a forward and backward pass timed here: at most as many as a trace
    # records
    for param, value, low in (("iters", iters, 1), ("warmup", warmup, 0)):
        check_range(f"profile: {param}", value, low, MAX_RECORDED)
    spec = get_spec(model)
    check_batch(model, batch_size, "profile: --batch-size")
    task = load_task(spec, seed, seq_len)
    net = build_model(model, seed, task.classes)
    opt = optimizer(net.parameters(), 0.01, 0.9)
    # A frozen or empty tensor has no gradient to time or send (and a profile row holds >= 1
    # element).
    names = {p: n for n, p in trained_parameters(net, model, "profile")}
    stamps: list[tuple[float, torch.nn.Parameter]] = []
    for p in names:
        p.register_post_accumulate_grad_hook(lambda q: stamps.append((time.perf_counter(), q)))
    x, y = task.batch(task.train, torch.arange(batch_size) % len(task.train))
    fwd, bwd, step, layers = [], [], [], []
    for i in range(warmup + iters):
        opt.zero_grad(set_to_none=True)
        stamps.clear()
        t0 = time.perf_counter()
        loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t2)
            times = [s[0] for s in stamps]
            layers.append([b - a for a, b in zip([t1, *times[:-1]], times, strict=True)])
        if on_step is not None:
            on_step(i + 1, warmup + iters)
    order = [names[q] for _, q in stamps]
    # Gaps are noisy one by one (a busy machine lands a pause on any of them): split the median
    # backward time in proportion to the mean gaps.
    means = [statistics.fmean(col) for col in zip(*layers, strict=True)]
    per_tensor = tuple(statistics.median(bwd) * m / sum(means) for m in means)
    sizes = {n: (p.numel(), tuple(p.shape)) for n, p in net.named_parameters()}
    where = (f"measured here by gradwire profile: torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, median of {iters} "
             f"iterations, load average {os.getloadavg()[0]:.2f}")
    return Profile(
        model=model, params=tuple((n, sizes[n][0]) for n in order),
        shapes=tuple(sizes[n][1] for n in order),
        forward_s=statistics.median(fwd), backward_s=statistics.median(bwd),
        step_s=statistics.median(step), backward_layer_s=per_tensor, batch_size=batch_size,
        description=f"{model}: {spec.description} (gradwire.models)",
        sources={"params": "the model as built by gradwire.models",
                 "forward_s": where, "backward_s": where, "step_s": where})
