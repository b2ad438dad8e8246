"""The simulator's options and reports: mechanism options it would ignore, layer edits past a
trace's limits, servers without a server, sweep labels, every link kind, γ in titles."""

from __future__ import annotations

import io
import re

import pytest
from conftest import cli_error, one_line_cli_error
from rich.console import Console

from gradwire.errors import GradwireError
from gradwire.sim import report
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.mechanisms import parse, parse_list, run


def _trace() -> tr.Trace:
    return tr.synthetic("m", [40_000, 20_000, 10_000], 0.01, 0.02)


IDEAL = SimCluster(2, 1e9, alpha=0.0, latency=0.0, iterations=2)


# ---------------------------------------------------------------- sweeps and their plot


@pytest.mark.parametrize("mechs, base", [("ring,butterfly", "ring"),
                                         ("butterfly,ps", "ps")])
def test_a_sweeps_plot_names_the_mechanism_its_speed_ups_are_over(mechs, base, tmp_path,
                                                                  monkeypatch):
    """Without ps the speed-ups are over the first mechanism, yet the plot said "speed-up over
    PS" whatever ran: ring's line at 1.0 read as ring being no faster than a parameter
    server."""
    rows = report.sweep(_trace(), IDEAL, parse_list(mechs), "workers", [2, 3])
    assert all(r["baseline"] == base for r in rows)
    assert all(r["speedup"][base] == 1.0 for r in rows)
    drawn = {}
    monkeypatch.setattr(report, "save_figure",
                        lambda fig, path, dpi: drawn.setdefault("fig", fig) and path)
    report.plot_sweep(rows, tmp_path / "s.png", "m")
    labels = [ax.get_ylabel() for ax in drawn["fig"].axes]
    assert labels == ["iteration time (s)", f"speed-up over {base}"]


def test_a_bandwidth_sweep_prints_rates_as_typed_not_bits_per_second(tmp_path):
    from gradwire.sim.simulate import _sweep

    out = io.StringIO()
    console = Console(file=out, width=200)
    _sweep(_trace(), IDEAL, "ring", "bandwidth=1gbit,10gbit", None, console)
    text = out.getvalue()
    assert "bandwidth=1gbit:" in text and "bandwidth=10gbit:" in text
    assert "e+09" not in text and "e+10" not in text


# ---------------------------------------------------------------- the results table


def test_the_results_table_shows_every_link_kinds_utilisation():
    """The table showed worker up, worker down and server down only: a server's up link,
    which multicast relieves (the distribution), was missing, so ps and multicast read the
    same link for link."""
    c = SimCluster(3, 1e9, alpha=0.0, latency=0.0, iterations=2)
    res = run(_trace(), c, parse_list("ps,multicast,ring"))
    t = report.results_table(res, "t")
    heads = [str(col.header) for col in t.columns]
    assert heads[5:9] == ["worker\nup", "worker\ndown", "server\nup", "server\ndown"]
    cells = {r.mechanism: [str(col._cells[i]) for col in t.columns]
             for i, r in enumerate(res)}
    ps, mc, ring = cells["ps"], cells["multicast"], cells["ring"]
    up = {m: r.utilisation["server up"] for m, r in zip(["ps", "multicast"], res, strict=False)}
    assert up["multicast"] < up["ps"]
    assert ps[7] == f"{up['ps']:.0%}" and mc[7] == f"{up['multicast']:.0%}"
    assert ring[7] == ring[8] == "-"  # no servers


# ---------------------------------------------------------------- mechanisms


@pytest.mark.parametrize("text", ["ring:itemsize=1", "ring:itemsize=2:bucket=4096",
                                  "ring+multicast:itemsize=8", "rd:itemsize=3"])
def test_an_itemsize_option_is_refused_not_silently_replaced(text):
    """``ring:itemsize=1`` was accepted and then replaced by the simulator's own unit: the run
    and its numbers were the plain ring's, the option typed had no effect."""
    with pytest.raises(GradwireError, match=re.escape(f"mechanism '{text}': option 'itemsize'")):
        parse(text)


@pytest.mark.parametrize("text", ["multicast:order=block", "multicast+ina:order=block",
                                  "multicast:order=roundrobin"])
def test_an_order_that_multicast_cannot_follow_is_refused(text):
    """Multicast sends each parameter once to every worker: ``multicast:order=block`` ran
    exactly what ``multicast`` runs, the order typed silently without effect."""
    with pytest.raises(GradwireError, match=re.escape(f"mechanism '{text}': order=")):
        parse(text)
    assert parse("ps:order=block").options.order == "block"  # unicast: it has an order
    assert parse("ina:order=block").options.order == "block"


@pytest.mark.parametrize("text, why", [
    ("ps:order=x", "order must be one of"),
    ("ps:order=block:barrier=off", "block distribution needs the barrier"),
    ("ring:barrier=off", "allreduce ring has no parameter 'barrier'.*: it takes pipeline; "
     "the mechanism also takes bucket= and compress=$"),
    ("ring+multicast:block=4", "reducescatter ring has no parameter 'block': it takes "
     "pipeline; the mechanism also takes bucket=$"),
])
def test_a_bad_mechanism_option_names_the_mechanism(text, why):
    """In a --mechanism list of several, "order must be one of ..." did not say which; a
    schedule parameter the algorithm lacks listed the schedule's only, not bucket=."""
    with pytest.raises(GradwireError) as e:
        parse_list(f"ring,{text},butterfly")
    assert re.match(re.escape(f"mechanism '{text}': ") + why, str(e.value)), str(e.value)


@pytest.mark.parametrize("text, size", [
    ("ring:bucket=25M", 25 * 2**20), ("ring:bucket=64k", 64 * 2**10),
    ("ring:bucket=1G:compress=fp16", 2**30), ("ring+multicast:bucket=4KB", 4096),
    ("ring:bucket=25000000", 25_000_000), ("ring:bucket=0", 0)])
def test_a_bucket_is_bytes_as_sizes_reads_them(text, size):
    """``ring:bucket=25M`` was refused ("bucket must be bytes >= 0, got '25M'"), though
    bench's ``--sizes 25M`` and whatif's ``--workers 1K`` read the same suffixes."""
    from gradwire.sizes import parse_size

    assert parse(text).options.bucket_bytes == size
    if size:
        assert size == parse_size(text.split("bucket=")[1].split(":")[0])


@pytest.mark.parametrize("value", ["25Q", "1.5M", "25e6", "-1", "0K"])
def test_a_bucket_that_is_no_size_is_one_line_naming_the_forms(value, monkeypatch, capsys):
    code, err = cli_error(monkeypatch, capsys, "simulate", "--model", "resnet50",
                          "--mechanism", f"ring:bucket={value}")
    one_line_cli_error(code, err, f"mechanism 'ring:bucket={value}': bucket must be a whole "
                       "number of bytes >= 0", "or a size like 64K or 25M")


# ---------------------------------------------------------------- gradwire trace's edits


@pytest.mark.parametrize("count, layer, what", [
    (1024, (2**41, 0.0, 0.0), "2\\*\\*50"),
    (1000, (1, 2000.0, 0.0), "--layer-forward-ms"),
    (1000, (1, 0.0, 2000.0), "--layer-backward-ms"),
])
def test_added_layers_past_any_traces_limits_are_refused_before_recording(count, layer, what,
                                                                          monkeypatch):
    """Each setting was checked alone: --add-layers 1024 of 2 TiB each (2**51 bytes) recorded
    the model first, for minutes on a large one, and only then failed."""
    from gradwire.sim import edit, record

    def never(*a, **k):
        raise AssertionError("recorded before the edits were checked")

    monkeypatch.setattr(record, "record", never)
    with pytest.raises(GradwireError, match=what):
        edit.make_trace("mlp-small", None, add_layers=count, layer=layer)


def test_a_parameter_resized_twice_is_refused(tmp_path):
    """--resize p0=10 --resize p0=20 made p0 20 bytes, the first value silently dropped."""
    from gradwire.sim.edit import make_trace

    path = tr.save(_trace(), tmp_path / "t.jsonl")
    assert make_trace(None, path, resize=["p0=10", "p1=20"]).params[0].bytes == 10
    with pytest.raises(GradwireError, match="p0 is already resized to 10 bytes"):
        make_trace(None, path, resize=["p0=10", "p0=20"])


# ---------------------------------------------------------------- simulate


def test_a_simulation_without_a_trace_is_one_line():
    """prepare([]) was accepted and the run then failed with an IndexError."""
    from gradwire.sim.simulate import prepare

    with pytest.raises(GradwireError, match="no --trace given"):
        prepare([])


def test_servers_for_a_run_without_a_parameter_server_are_refused(tmp_path):
    """`--mechanism ring,butterfly --servers 4` ran two collectives and titled the table
    "4 server(s)": the servers typed took no part."""
    from gradwire.sim.simulate import prepare

    path = tr.save(_trace(), tmp_path / "t.jsonl")
    with pytest.raises(GradwireError, match="--servers 4 is for the parameter-server"):
        prepare([path], mechanism="ring,butterfly", servers=4)
    with pytest.raises(GradwireError, match="--servers 2 is for the parameter-server"):
        prepare([path], mechanism="ring", servers=2, emulate=True)
    # a run with any of the family takes them; so do --table (8 sets its own) and --emulate's
    # default mechanisms (ps among them)
    assert prepare([path], mechanism="ring,ina:sharding=even", servers=4).cluster.servers == 4
    assert prepare([path], servers=4, emulate=True).cluster.servers == 4
    assert prepare([path], mechanism="ring", servers=4, table=4).cluster.servers == 4
    assert prepare([path], mechanism="ring").cluster.servers == 1


def test_titles_name_the_gamma_a_run_simulated():
    """With --calibration's γ every reduction cost time, yet the title named α and latency
    only: a run with γ and one without had the same title and different numbers."""
    c = SimCluster(2, 1e9, alpha=5e-6, latency=0.0, gamma=2e-10)
    assert report.host_costs(c) == "α 5 µs, latency 0 µs/host, γ 0.2 ns/B"
    assert report.host_costs(IDEAL) == "α 0 µs, latency 0 µs/host"
    t, _ = report.paper_table(9, [_trace()], c)
    assert "γ 0.2 ns/B" in str(t.title)
