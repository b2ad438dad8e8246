"""Wide tables fit a 120-column terminal or wrap sensibly: at 120 columns, with the longest
names and figures a user's inputs give, no line is longer than the terminal and no figure,
name or header is cut to "…"; at 80 a cell may fold onto another line, never be cut."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table

from gradwire.perf import report as perf_report
from gradwire.perf import scenario
from gradwire.report import results_table as training_table
from gradwire.sim import report as sim_report
from gradwire.sim.cluster import SimCluster, SimResult
from gradwire.sim.trace import synthetic

# six link rates, the first so slow that an iteration takes hours (8-digit milliseconds)
RATES = "100kbit,1gbit,10gbit,25gbit,100gbit,400gbit"


def _text(table: Table, width: int) -> str:
    """``table`` as a terminal ``width`` columns wide shows it, checked: no line longer than
    the terminal and nothing cut to "…"."""
    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(table)
    text = console.export_text()
    assert "…" not in text, text
    assert max(map(len, text.splitlines())) <= width, text
    return text


def _lines_with(text: str, *words: str) -> list[str]:
    """The lines of ``text`` holding every one of ``words`` whole (as words)."""
    return [line for line in text.splitlines() if all(w in line.split() for w in words)]


def _first_column(text: str) -> str:
    """What the first column of a table's body says, its lines joined: the names, whole
    where a long one is on several lines."""
    body = text.split("─ \n", 1)[1]
    return "".join(line.split()[0] for line in body.splitlines() if line[1:2].strip())


def test_whatif_tables_fit_with_six_link_rates_and_ten():
    """With six rates, at 120 columns the 8-digit times of a 100kbit link fit; at 80 the
    aggregation labels were cut to "topk ρ=0.0…" and the headers to "100kbit: ms…". Ten
    rates, at 120, cut every figure of the first column to "12267447…"; they are tables of
    six rates at most now."""
    s = scenario.Scenario(agg="dense,topk,gtopk,powersgd", density=0.000123)
    for rates in (RATES, RATES + ",40gbit,50gbit,200gbit,2gbit"):
        found = scenario.whatif(s, "4,4096", rates, "1")
        slow = {(r["agg"], r["workers"]): f"{r['iteration_s'] * 1e3:.1f}"
                for r in found.result["rows"] if r["bandwidth"] == "100kbit"}
        assert max(map(len, slow.values())) >= 10  # 16354625.8 ms: hours an iteration
        tables = perf_report.whatif_tables(found)
        assert len(tables) == (2 if rates == RATES else 4)
        for t in tables:
            _text(t, 80)
        text = "".join(_text(t, 120) for t in tables)
        for (agg, workers), ms in slow.items():  # each row on one line, its figures whole
            assert _lines_with(text, *agg.split(), str(workers), ms), (agg, workers, ms)
        for r in found.result["answers"]:
            assert f"{r['coding_budget_s'] * 1e3:.1f}" in text.split()


def test_the_advise_table_fits_and_keeps_its_labels_whole():
    """At 80 columns the headers were cut ("iterati…", "aggrega…") and, on a 100kbit link of
    4096 workers, every time ("8178372…"); at 120 "gtopk ρ=0.000123" was broken in two."""
    found = scenario.advise(scenario.Scenario(density=0.000123, ranks_per_node=8,
                                              intra_bandwidth="3.6tbit"), 4096, "100kbit", 1.0)
    table = perf_report.advice_table(found)
    _text(table, 80)
    text = _text(table, 120)
    for i, r in enumerate(found.ranked, 1):
        assert _lines_with(text, str(i), *r.agg.label.split(), f"{r.seconds * 1e3:.1f}",
                           f"{float(r.prediction.communicate) * 1e3:.1f}"), r.agg.label
    for word in ("iteration", "efficiency", "encode+", "payload/rank"):
        assert word in text.split()
    # and the default, 32 workers on 1gbit, at 80: nothing folds either
    t80 = _text(perf_report.advice_table(scenario.advise(scenario.Scenario(), 32, "1gbit",
                                                         1.0)), 80)
    assert {"iteration", "efficiency", "payload/rank", "powersgd"} <= set(t80.split())


def test_the_profiles_table_keeps_every_name_whole_at_80():
    """`gradwire profile` at 80 columns cut "inception-v3" to "inception-…" and words of the
    descriptions ("(bert-base…")."""
    from gradwire import profiles

    text = _text(perf_report.profiles_table(), 80)
    for name in profiles.builtin_names():
        assert _lines_with(text, name, f"{profiles.load(name).numel:,}"), name
    assert "(bert-base-uncased," in text.split()


LABELS = ("ps:order=block:sharding=even", "multicast+ina:sharding=even:barrier=off",
          "ring:bucket=26214400:compress=powersgd:rank=4:seed=123456",
          "ring:compress=gtopk:density=0.001")


def _sim_result(mechanism: str, iteration_s: float) -> SimResult:
    kinds = ("worker up", "worker down", "server up", "server down")
    return SimResult(mechanism, iteration_s, [0.0, iteration_s], 0.1830,
                     dict.fromkeys(kinds, 1e9), dict.fromkeys(kinds, 1.0), wall_s=1234.56)


def test_the_simulate_table_fits_long_mechanism_labels():
    """Mechanisms with options (``ring:compress=powersgd:rank=4``) cut every time to
    "1234…" and the speed-up header to "ps:o…" at 120 columns: a long label is broken after
    a ``:``, whole."""
    results = [_sim_result(m, 12345.6789 / (k + 1)) for k, m in enumerate(LABELS)]
    table = sim_report.results_table(results, "resnet50: 8 workers, 100kbit")
    _text(table, 80)
    text = _text(table, 120)
    for r in results:
        first = sim_report.broken(r.mechanism, sim_report.LABEL_WIDTH).splitlines()[0]
        assert _lines_with(text, first, sim_report.seconds(r.iteration_s),
                           sim_report.seconds(r.exposed_s), "1234.56"), r.mechanism
    assert _first_column(text) == "".join(LABELS)  # every label whole, on lines of its own
    assert "ps:order=block:sharding=even" in text.split()  # 28 characters: on one line
    assert _lines_with(text, "speed-up") and _lines_with(text, "vs", "row", "1")
    short = sim_report.results_table([_sim_result(m, 1.0) for m in ("ring", "ps")], "t")
    assert _lines_with(_text(short, 120), "vs", "ps")


def test_the_emulation_check_table_fits_long_mechanism_labels():
    """``simulate --emulate``'s table cut "ring:bucket=26214400:compress=powersgd:rank…" at
    120 columns."""
    rows = [{"mechanism": m, "servers": 2, "alpha_s": 5.1e-5, "simulated_s": 12345.6789,
             "measured_s": 12346.789, "error": -0.0123, "simulated_link_bytes": 1,
             "measured_link_bytes": 1} for m in LABELS]
    table = sim_report.validation_table(rows, "t")
    _text(table, 80)
    text = _text(table, 120)
    for m in LABELS:
        assert _lines_with(text, sim_report.broken(m, sim_report.LABEL_WIDTH).splitlines()[0],
                           "12345.6789", "12346.7890", "-1.2%", "yes"), m
    assert _first_column(text) == "".join(LABELS)


def test_a_paper_table_wraps_a_long_model_name_instead_of_cutting_it():
    """A profile's model name is any string: one of 104 characters was cut to
    "bert-large-…-finetun…" at 120 columns."""
    name = "bert-large-uncased-whole-word-masking-finetuned-squad" * 2
    traces = [synthetic(name, [40_000, 20_000, 10_000], 0.01, 0.02),
              synthetic("resnet50", [40_000, 20_000], 0.01, 0.02)]
    table, rows = sim_report.paper_table(4, traces, SimCluster(4, 1e5, iterations=1))
    _text(table, 80)
    text = _text(table, 120)
    assert _first_column(text) == name + "resnet50"
    for r in rows:
        cells = [f"{r[k]:.2f}x" for k in sim_report.PAPER_TABLES[4]["columns"]]
        assert [line for line in text.splitlines() if line.split()[-3:] == cells], r["model"]


def _training(agg: str, samples_per_s: float, comm_s: float, **over) -> dict:
    """A text model's result on a slow link: seconds of communication an iteration, hours of
    training."""
    r = {"agg": agg, "density": 0.001, "density_per_epoch": [0.25, 0.0725], "model": "lstm",
         "data": "text", "samples_per_s": samples_per_s,
         "wire_tx_bytes_per_iter_per_rank": 3.6e6, "payload_bytes_per_iter_per_rank": 3.5e6,
         "wall_s": 12345.6, "loss": [4.0, 3.25], "test_loss": [4.0, 3.5],
         "test_accuracy": [0.3, 0.456], "epoch_wall_s": [6000.0, 12345.6],
         "seconds_per_iter": {"compute": 0.1234, "compress": 0.0123, "communicate": comm_s,
                              "step": comm_s + 0.2}}
    return r | over


def test_the_training_table_fits_a_text_model_s_warm_up_row():
    """A text model's 14 columns and a sparsifier that ended in its warm-up ("randomk
    ρ=0.0725 warm-up") cut the headers at 120 columns ("sample…", "compre…"): the method
    wraps at its spaces instead, every figure whole on its row's first line."""
    results = [_training("dense", 44.0, 2.8501), _training("randomk", 1234.0, 0.0987),
               _training("powersgd", 456.0, 0.2345, rank=4)]
    table = training_table(results, "lstm, 4 hosts at 10mbit")
    _text(table, 80)
    text = _text(table, 120)
    for word in ("samples/s", "speed-up", "payload", "compress", "ppl", "acc", "ρ=0.0725",
                 "warm-up"):
        assert word in text.split(), word
    for r, speedup in zip(results, ("1.00×", "28.05×", "10.36×"), strict=True):
        s = r["seconds_per_iter"]
        assert _lines_with(text, r["agg"], f"{r['samples_per_s']:.0f}", speedup, "3.600",
                           "3.500", "123.4", "12.3", f"{s['communicate'] * 1e3:.1f}",
                           f"{s['step'] * 1e3:.1f}", "12345.6", "3.2500", "33.115", "45.6"), r


def test_whatif_shares_the_rates_evenly_between_its_tables():
    """Seven rates made a table of six and one of one, whose narrow title wrapped onto nine
    lines; they are four and three."""
    s = scenario.Scenario(agg="dense,topk")
    rates = "100mbit,1gbit,10gbit,25gbit,40gbit,100gbit,400gbit"
    tables = perf_report.whatif_tables(scenario.whatif(s, "4,8", rates, "1"))
    assert [len(t.columns) - 2 for t in tables[:2]] == [4, 3]  # aggregation, workers, rates
    assert [len(t.columns) - 1 for t in tables[2:]] == [4, 3]  # workers, rates
