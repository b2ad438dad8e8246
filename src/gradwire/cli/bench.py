"""``gradwire bench`` and ``gradwire calibrate``: time collectives, and measure the terms the
cost model needs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from gradwire.bandwidth import parse_bandwidth
from gradwire.cli.options import (
    Bandwidth,
    ClusterName,
    Hosts,
    Loopback,
    Mtu,
    check_outputs,
    cluster_for,
    command_line,
    console,
    planned_ranks,
    write_json,
)
from gradwire.cluster.netns import MTU
from gradwire.cluster.state import MAX_HOSTS, check_mtu
from gradwire.errors import GradwireError
from gradwire.jsonfile import save_elsewhere
from gradwire.launcher import check_timeout

_SIZES = "nccl-tests' -b, -e and -f are --sizes MIN:MAX[:FACTOR] here (-b is --bandwidth)"
# nccl-tests' short options that bench does not take, and what does their work here
NCCL_TESTS_OPTIONS = {
    "-e": _SIZES, "-f": _SIZES, "-i": _SIZES,
    **{o: f"nccl-tests' {o} is --hosts here (a rank per emulated host)" for o in ("-g", "-t")},
    **{o: f"nccl-tests' {o} is {ours} here" for o, ours in (
        ("-w", "--warmup"), ("-d", "--dtype"), ("-o", "--op"))},
    "-m": "nccl-tests' -m (calls aggregated in one group) has no counterpart; its -n, the "
          "calls timed back to back, is --batch here",
    "-c": "nccl-tests' -c: bench checks every row",
}


def nccl_tests_hint(option: str) -> str:
    """What bench takes for nccl-tests' short ``option``; "" for any other."""
    hint = NCCL_TESTS_OPTIONS.get(option)
    return f"; {hint}" if hint else ""


def check_bandwidth(text: str) -> None:
    """bench's --bandwidth; a value that fails as a rate but reads as a message size (nccl-tests'
    ``-b 8K``, its begin size) says in the same line what takes sizes here."""
    from gradwire.sizes import parse_size

    try:
        parse_bandwidth(text)
    except GradwireError as e:
        try:
            parse_size(text)
        except GradwireError:
            raise e from None
        raise GradwireError(f"{e}; {_SIZES}") from None


if TYPE_CHECKING:
    from gradwire.perf.calibration import Calibration


def bench(
    ctx: typer.Context,
    collective: Annotated[str, typer.Option(help="allreduce, broadcast, reduce, allgather or "
                                            "reducescatter")] = "allreduce",
    algo: Annotated[str | None, typer.Option(help="comma list, each NAME or NAME:KEY=VALUE[:...] "
                                             "(e.g. ring:pipeline=4); default: every algorithm "
                                             "of the collective")] = None,
    sizes: Annotated[str, typer.Option(help="bytes (K, M, G: powers of 1024): 1K:64M "
                                       "(doubling), 1K:64M:4, or a comma list; from one "
                                       "element of --dtype up to what the "
                                       "ranks' buffers (about 3 x hosts x size, 4 x in a "
                                       "1-byte dtype) leave of "
                                       "this machine's memory")] = "1K:64M",
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    dtype: Annotated[str, typer.Option(help="float32, float16, bfloat16, float64, int8, "
                                       "uint8, int32 or int64 (integer sums wrap, as "
                                       "c10d's do); a comma list of them, or all: each "
                                       "dtype's rows in turn")] = "float32",
    op: Annotated[str, typer.Option(help="reduction of allreduce, reduce and reducescatter: "
                                    "sum, avg (the sum, then one division by the ranks), max, "
                                    "min or prod; a comma list of them, or all (avg for the "
                                    "float dtypes)")]
    = "sum",
    iters: Annotated[int, typer.Option(min=1, help="timed runs per size and algorithm; a "
                                       "row reports their median")] = 5,
    batch: Annotated[int, typer.Option(min=1, help="calls timed back to back in each run "
                                       "(nccl-tests' -n), after one untimed lead-in call "
                                       "that starts the links from idle")] = 2,
    warmup: Annotated[int, typer.Option(min=0, help="untimed calls first")] = 1,
    interleave: Annotated[bool, typer.Option(help="run the algorithms (and the baseline) in "
                                             "turn, one timed run each per round, instead of "
                                             "one after another: ratios between them then "
                                             "hold on a machine whose speed drifts")] = False,
    param: Annotated[list[str] | None, typer.Option(help="algorithm parameter KEY=VALUE "
                                                    "for every listed algorithm that takes "
                                                    "it (repeatable)")] = None,
    builtin: Annotated[bool, typer.Option(help="add torch.distributed's own collective as "
                                          "the baseline row")] = True,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 3600,
    json_out: Annotated[str | None, typer.Option("--json", help="write rows here")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
    device: Annotated[str, typer.Option(help="cpu (gloo) or cuda: buffers on the GPU, over "
                                        "NCCL; every emulated host is its own NCCL host, "
                                        "so hosts may share one GPU")] = "cpu",
) -> None:
    """Time collectives like nccl-tests, with the built-in collective and the model's
    prediction beside each algorithm. Every result is checked: the command fails (after
    writing --json) when any element came out wrong."""
    from gradwire.bench.report import wrong_rows
    from gradwire.bench.run import run_bench
    from gradwire.bench.spec import (
        BUILTIN,
        ITEMSIZE,
        check_device,
        check_schedules,
        check_shared,
        check_sizes,
        measured_sizes,
        pairs,
        parse_dtypes,
        parse_ops,
        parse_params,
        parse_specs,
    )
    from gradwire.sizes import parse_sizes

    (json_path,) = check_outputs(("--json", json_out))
    check_timeout(timeout)
    specs = parse_specs(collective, algo)
    if not builtin and any(s.name == BUILTIN for s in specs):  # it would run all the same
        raise GradwireError(f"--no-builtin conflicts with --algo {algo!r}, which lists "
                            "builtin: drop one of them")
    ops = parse_ops(collective, op)
    dtypes = parse_dtypes(dtype)
    runs, unaveraged = pairs(dtypes, ops)
    check_device(device)
    try:
        size_list = parse_sizes(sizes)
    except GradwireError as e:  # which option, as whatif's --workers says
        raise GradwireError(f"--sizes: {e}") from None
    params = parse_params(param or [])
    check_shared(collective, specs, params)
    check_bandwidth(bandwidth)
    # what the ranks would find wrong, found here: one line instead of a traceback per rank
    p = planned_ranks(hosts, cluster)
    # the widest dtype first: its smallest size is the bound for all
    for d in sorted(dict.fromkeys(d for d, _ in runs), key=lambda d: -ITEMSIZE[d]):
        check_sizes(size_list, d, p, device, collective in ("allgather", "reducescatter"))
        item = ITEMSIZE[d]
        check_schedules(collective, specs, params, p,
                        [n // item for n in measured_sizes(size_list, d, p, collective)], item)
    if unaveraged:
        console.print(f"note: --op avg times the float dtypes only, not "
                      f"{', '.join(unaveraged)}", highlight=False)
    with cluster_for(ctx, hosts, bandwidth, cluster, loopback, mtu) as c:
        result = run_bench(c, collective, specs, size_list, dtypes, iters, warmup, params,
                           builtin, timeout, console, interleave, ops, device, batch)
    result["command"] = command_line()
    failed = wrong_rows(result["rows"])
    if json_path:
        try:
            write_json(json_path, result)
        except GradwireError as e:  # saved elsewhere, it says where: said after the wrong rows
            raise GradwireError("; ".join(m for m in (failed, str(e)) if m)) from None
    if failed:
        raise GradwireError(failed)


def calibrate(
    ctx: typer.Context,
    hosts: Annotated[int, typer.Option("--hosts", "-n", help="number of hosts (ranks), 2 to "
                                       "250")] = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 600,
    model: Annotated[str, typer.Option(help="profile (built-in name or JSON file) whose DDP "
                                       "bucket (25 MiB, or the whole model) the codecs are "
                                       "timed on")] = "resnet50",
    density: Annotated[float, typer.Option(help="sparsifiers' kept fraction")] = 0.001,
    rank: Annotated[int, typer.Option(help="PowerSGD's rank")] = 4,
    device: Annotated[str | None, typer.Option(help="cpu (gloo) or cuda (NCCL, each rank on "
                                               "cuda:LOCAL_RANK); default: cuda where there "
                                               "is one")] = None,
    out: Annotated[str | None, typer.Option(help="write the calibration here; default "
                                            "$GRADWIRE_HOME (~/.cache/gradwire)/calibration/"
                                            "RATE.json (RATE-mtuN.json at another MTU, "
                                            "loopback.json unshaped), required under a "
                                            "launcher")] = None,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Measure α (the backend's allreduce per ring step, and gradwire's own executor's), β
    (streaming, between nodes and within one), γ (reduction), each method's encode and
    decode, how much backward slows beside communication (κ) and beside encoding, how much
    longer ranks compute under DDP all at once than a profile says, and on CPU how ranks
    share cores, on the ranks' own device; save them for whatif/advise --calibration. Under
    torchrun or gradwire run (RANK, WORLD_SIZE and MASTER_ADDR set) this is one rank of the
    measurement, and the cluster options are not used; otherwise it runs on an emulated
    cluster of --hosts."""
    import os

    from gradwire.bench import calibrate as cal

    device = device or cal.default_device()
    launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))
    if launched and out is None:
        raise GradwireError("gradwire calibrate under a launcher (RANK, WORLD_SIZE and "
                            "MASTER_ADDR are set) needs --out FILE")
    first = not launched or os.environ["RANK"] == "0"
    out_path = None if out is None else Path(out)  # only the first rank writes it
    if first:  # the one that writes --out: not over the profile it reads
        (out_path,) = check_outputs(("--out", out), inputs=(("--model", model),))
    prof = cal.check_args(model, density, rank, device, out_path if first else None)
    if launched:
        with _kept_if_unsaved():
            done = cal.run(out_path, prof, model, density, rank, device, command_line())
        if done is not None:
            _show_calibration(done, out_path)
        return
    check_timeout(timeout)
    parse_bandwidth(bandwidth)
    check_mtu(mtu)
    if cluster is None and not 2 <= hosts <= MAX_HOSTS:  # a cluster's own range starts at 1
        raise GradwireError(f"calibrate needs --hosts from 2 to {MAX_HOSTS}, got {hosts}")
    p = planned_ranks(hosts, cluster)  # a live cluster's hosts, not --hosts
    if p < 2:
        raise GradwireError(f"calibrate needs 2 or more hosts: cluster {cluster} has {p}")
    args = ["--model", model, "--density", repr(density), "--rank", str(rank),
            "--device", device]
    with _kept_if_unsaved():
        done, path = cal.calibrate(lambda: cluster_for(ctx, hosts, bandwidth, cluster,
                                                       loopback, mtu),
                                   out_path, args, command_line(), timeout, console)
    _show_calibration(done, path)


@contextlib.contextmanager
def _kept_if_unsaved() -> Iterator[None]:
    """A calibration that could not be saved (a disk that filled during the run) goes to a new
    file instead (:func:`save_elsewhere`), and the command fails with one line saying where."""
    from gradwire.bench.calibrate import Unsaved

    try:
        yield
    except Unsaved as e:
        raise GradwireError(f"{e}; {save_elsewhere(e.path, e.cal.dumps())}") from None


def _show_calibration(c: Calibration, path: Path) -> None:
    from gradwire.bench.report import rate_text

    # β, the link and γ to three significant digits: a 100kbit link's rate and a GPU's γ are
    # 0.000 at three decimals. Units on a second header line and no rules, as bench's table:
    # a GPU's name fits 120 columns; the file's path, which may be long, is a line of its own
    t = Table("α/step\n(us)", "α call\n(us)", "β\n(ns/byte)", "link\n(Gbit/s)",
              "γ\n(ns/byte)", "κ", "coding", "ranks", "device",
              title=f"calibration, {c.network or 'β between ' + c.beta_between}",
              box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    t.add_row(f"{c.alpha_s * 1e6:.1f}", f"{c.alpha_call_s * 1e6:.1f}",
              rate_text(c.beta_s_per_byte * 1e9, 0), rate_text(8 / c.beta_s_per_byte / 1e9, 0),
              rate_text(c.gamma_s_per_byte * 1e9, 0), f"{c.overlap_slowdown:.2f}",
              f"{c.coding_slowdown:.2f}", f"{c.world} ({c.backend})", c.device)
    console.print(t)
    console.print(f"saved to {path}", highlight=False, soft_wrap=True)
    if c.alpha_transport_s is not None:
        console.print(f"gradwire's executor (sparse schedules, call headers): α "
                      f"{c.alpha_transport_s * 1e6:.1f} µs/step")
    if c.compute is not None:
        console.print(f"compute as the ranks run it: ×{c.compute_slowdown:.2f} "
                      f"({c.compute.model}: {c.compute.alone_s * 1e3:.2f} ms an iteration "
                      f"alone, {c.compute.together_s * 1e3:.2f} ms under DDP with every "
                      "rank at once)")
    if c.cpu is not None:
        import dataclasses

        from gradwire.perf.whatif import CpuSetting

        u = c.cpu
        terms = CpuSetting.from_calibration(dataclasses.asdict(u), c.world).describe()
        console.print(f"shared-CPU terms: {u.cpu_ranks_per_machine} ranks on "
                      f"{u.cores_per_machine} cores; {terms}")
    t = Table("method", "encode (ms)", "decode (ms)",
              title=f"encode/decode of {c.codecs.numel:,} fp32 elements ({c.model}'s bucket), "
                    f"{c.device}, each method's local work in a hook")
    for name, m in c.codecs.methods.items():
        t.add_row(name, f"{m['encode_s'] * 1e3:.2f}", f"{m['decode_s'] * 1e3:.2f}")
    console.print(t)
