"""``gradwire bench`` and ``gradwire calibrate``: time collectives, and measure the terms the
cost model needs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gradwire.bandwidth import parse_bandwidth
from gradwire.cli.options import (
    Bandwidth,
    ClusterName,
    Hosts,
    Loopback,
    Mtu,
    check_outputs,
    check_range,
    cluster_for,
    command_line,
    console,
    world_size,
    write_json,
)
from gradwire.cluster.netns import MTU
from gradwire.cluster.state import check_mtu
from gradwire.errors import GradwireError
from gradwire.launcher import check_timeout


def bench(
    ctx: typer.Context,
    collective: Annotated[str, typer.Option(help="allreduce, broadcast, reduce, allgather or "
                                            "reducescatter")] = "allreduce",
    algo: Annotated[str | None, typer.Option(help="comma list, each NAME or NAME:KEY=VALUE[:...] "
                                             "(e.g. ring:pipeline=4); default: every algorithm "
                                             "of the collective")] = None,
    sizes: Annotated[str, typer.Option(help="bytes: 1K:64M (doubling), 1K:64M:4, or a comma "
                                       "list; from one element of --dtype up to what the "
                                       "ranks' buffers (about 3 x hosts x size) leave of "
                                       "this machine's memory")] = "1K:64M",
    hosts: Hosts = 4,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    dtype: Annotated[str, typer.Option(help="float32, float16, bfloat16 or float64")] = "float32",
    op: Annotated[str, typer.Option(help="reduction of allreduce, reduce and reducescatter: "
                                    "sum or avg (the sum, then one division by the ranks)")]
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
    json_out: Annotated[Path | None, typer.Option("--json", help="write rows here")] = None,
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
        ITEMSIZE,
        check_device,
        check_dtype,
        check_op,
        check_schedules,
        check_shared,
        check_sizes,
        parse_params,
        parse_specs,
    )
    from gradwire.sizes import parse_sizes

    check_outputs(("--json", json_out))
    check_timeout(timeout)
    specs = parse_specs(collective, algo)
    check_op(collective, op)
    check_dtype(dtype)
    check_device(device)
    size_list = parse_sizes(sizes)
    params = parse_params(param or [])
    check_shared(collective, specs, params)
    parse_bandwidth(bandwidth)
    # what the ranks would find wrong, found here: one line instead of a traceback per rank
    p = world_size(hosts, cluster)
    check_sizes(size_list, dtype, p, device)
    count = size_list[0] // ITEMSIZE[dtype]
    if collective in ("allgather", "reducescatter"):
        count -= count % p
    check_schedules(collective, specs, params, p, count, ITEMSIZE[dtype])
    with cluster_for(ctx, hosts, bandwidth, cluster, loopback, mtu) as c:
        result = run_bench(c, collective, specs, size_list, dtype, iters, warmup, params,
                           builtin, timeout, console, interleave, op, device, batch)
    result["command"] = command_line()
    if json_out:
        write_json(json_out, result)
    failed = wrong_rows(result["rows"])
    if failed:
        raise GradwireError(failed)


def calibrate(
    ctx: typer.Context,
    hosts: Hosts = 2,
    bandwidth: Bandwidth = "1gbit",
    cluster: ClusterName = None,
    timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 600,
    codec_numel: Annotated[int, typer.Option(min=0, help="also time every compressor's encode "
                                             "and decode on this many elements (0: skip; at "
                                             "most 2**27)")] = 2_000_000,
    mtu: Mtu = MTU,
    loopback: Loopback = False,
) -> None:
    """Measure α (ping-pong, and per step of an allreduce over every host), β (streaming), γ
    (reduction), the CPU ranks spend and how they share cores, and each method's encode and
    decode time, and save them with the links' token bucket for the model (whatif/advise
    --codecs FILE reads the coding times)."""
    from gradwire.bench import calibrate as cal
    from gradwire.perf.whatif import CpuSetting

    check_timeout(timeout)
    parse_bandwidth(bandwidth)
    check_mtu(mtu)
    # 2**27 elements is 512 MiB in fp32, each compressor's copies on top: more is a typo that
    # would run out of memory after the whole cluster part has run
    check_range("--codec-numel", codec_numel, 0, 2**27)
    if cluster is None and hosts < 2:
        raise GradwireError(f"calibrate needs --hosts >= 2, got {hosts}")
    world_size(hosts, cluster)
    d = cal.calibrate(lambda: cluster_for(ctx, hosts, bandwidth, cluster, loopback, mtu),
                      codec_numel, timeout, console)
    t = Table("α (us)", f"α per step, {d['hosts']} ranks (us)", "β (ns/byte)", "link (Gbit/s)",
              "burst (kB, measured)", "γ (ns/byte)", "network", "saved to")
    t.add_row(f"{d['alpha_s'] * 1e6:.1f}", f"{d['alpha_step_s'] * 1e6:.1f}",
              f"{d['beta_s_per_byte'] * 1e9:.3f}",
              f"{d['link_gbit_per_s_measured']:.3f}",
              f"{d['burst_bytes'] / 1e3:.0f} ({d['burst_bytes_measured'] / 1e3:.0f})",
              f"{d['gamma_s_per_byte'] * 1e9:.4f}", d["network"], d["path"])
    console.print(t)
    console.print(f"shared-CPU terms for the model: {d['cpu_ranks_per_machine']} ranks on "
                  f"{d['cores_per_machine']} cores; "
                  f"{CpuSetting.from_calibration(d, d['hosts']).describe()}")
    if codec_numel:
        how = ("through the hook" if "through the hook" in d["codecs"]["source"]
               else "compressors only")
        t = Table("method", "encode (ms)", "decode (ms)",
                  title=f"encode/decode of {codec_numel:,} fp32 elements, this machine ({how})")
        for name, m in d["codecs"]["methods"].items():
            t.add_row(name, f"{m['encode_s'] * 1e3:.2f}", f"{m['decode_s'] * 1e3:.2f}")
        console.print(t)
