"""`gradwire train`, `demo` and `bench` reports where they told less than what happened: result
files with no provenance, a --json that could not be written costing train's table and figure,
and bus bandwidths of slow links printed as one digit. Each runs in this process on synthetic
results, with the cluster and the training replaced."""

import contextlib
import errno
import json
import types

import pytest
from conftest import run_cli
from rich.console import Console

LABEL = "loopback, links not shaped"


def _result(agg: str = "dense", samples_per_s: float = 100.0) -> dict:
    return {"agg": agg, "density": 0.001, "density_per_epoch": [0.001], "model": "mlp-small",
            "parameters": 1000, "world_size": 2, "epochs": 1, "data": "digits",
            "samples_per_s": samples_per_s, "wire_tx_bytes_per_iter_per_rank": None,
            "payload_bytes_per_iter_per_rank": 4000, "wall_s": 1.0, "loss": [1.0],
            "test_loss": [1.1], "test_accuracy": [0.7], "epoch_wall_s": [1.0],
            "seconds_per_iter": dict.fromkeys(("compute", "compress", "communicate", "step"),
                                              0.01)}


@pytest.fixture
def trained(monkeypatch, tmp_path):
    """train and demo runs that make no cluster and train nothing: each method's result is
    :func:`_result`'s; the current folder is ``tmp_path``."""
    import gradwire.cli.train
    import gradwire.demo
    import gradwire.train.job

    @contextlib.contextmanager
    def cluster(hosts, *args, **kwargs):
        yield types.SimpleNamespace(label=LABEL, hosts=[None] * hosts)

    def train_on(cluster, cfg, label, timeout, console):
        return _result(label)

    monkeypatch.setattr(gradwire.cli.train, "ephemeral_cluster", cluster)
    monkeypatch.setattr(gradwire.train.job, "train_on", train_on)
    monkeypatch.setattr(gradwire.demo, "train_on", train_on)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _has_provenance(doc: dict, command: str) -> None:
    assert doc["command"].startswith(command), doc.get("command")
    for key in ("date", "commit", "machine"):
        assert isinstance(doc.get(key), str) and doc[key], (key, doc.get(key))


def test_train_json_records_its_command_date_commit_and_machine(monkeypatch, capsys, trained):
    """`gradwire train --json` wrote the run's figures with no command, date, commit or
    machine, where bench, calibrate and simulate files record them all."""
    code, out, err = run_cli(monkeypatch, capsys, [
        "train", "--loopback", "--hosts", "2", "--model", "mlp-small", "--epochs", "1",
        "--json", "r.json"])
    assert code == 0, err
    doc = json.loads((trained / "r.json").read_text())
    assert doc["samples_per_s"] == 100.0
    _has_provenance(doc, "gradwire train --loopback --hosts 2")


def test_demo_json_records_its_command_date_commit_and_machine(monkeypatch, capsys, trained):
    code, out, err = run_cli(monkeypatch, capsys, [
        "demo", "--loopback", "--hosts", "2", "--model", "mlp-small", "--epochs", "1",
        "--agg", "dense,int8", "--json", "r.json", "--plot", "d.png"])
    assert code == 0, err
    docs = json.loads((trained / "r.json").read_text())
    assert [d["agg"] for d in docs] == ["dense", "int8"]
    for d in docs:
        _has_provenance(d, "gradwire demo --loopback --hosts 2")


def test_a_train_json_that_cannot_be_written_costs_neither_table_nor_figure(
        monkeypatch, capsys, trained):
    """The --json folder on a disk that filled during the run: the result went elsewhere (and
    the line said where), but train stopped there, with no table and no figure, whose path
    was fine, after the whole training run."""
    import gradwire.cli.options
    import gradwire.report

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    drawn = []
    monkeypatch.setattr(gradwire.cli.options, "replace_text", full)
    monkeypatch.setattr(gradwire.report, "save_figure", lambda fig, path, dpi: drawn.append(path))
    code, out, err = run_cli(monkeypatch, capsys, [
        "train", "--loopback", "--hosts", "2", "--model", "mlp-small", "--epochs", "1",
        "--json", "r.json", "--plot", "c.png"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "could not write r.json" in lines[0] and "result saved to" in lines[0], err
    assert "samples/s" in " ".join(out.split()), out  # the table
    assert [str(p) for p in drawn] == ["c.png"], drawn  # the figure
    (kept,) = trained.glob("gradwire-r-*.json")
    assert json.loads(kept.read_text())["agg"] == "dense"


def test_a_slow_link_s_bus_bandwidths_keep_their_digits():
    """At 1 Mbit/s every row's busbw printed as 0.001 Gbit/s and algbw as 0.0001 GB/s, and the
    footer gave every algorithm the same 0.001: the table could not tell them apart."""
    from gradwire.bench.report import annotate, footer, table

    rows = [{"collective": "allreduce", "algo": algo, "name": "ring", "params": {},
             "count": 256, "bytes": 1024, "type": "float32", "redop": "sum", "time_s": t,
             "wrong": 0} for algo, t in (("ring", 0.0164), ("tree", 0.0219))]
    annotate(rows, 4, None)
    lines = footer(rows)
    assert lines[1:] == ["# Avg bus bandwidth    : ring 0.000749 Gbit/s",
                         "# Avg bus bandwidth    : tree 0.000561 Gbit/s"], lines
    console = Console(record=True, width=250)
    console.print(table(rows, "slow"))
    text = " ".join(console.export_text().split())
    assert "0.0000624" in text and "0.0000468" in text, text  # algbw, GB/s
    assert "0.000749" in text and "0.000561" in text, text  # busbw, Gbit/s
    # a fast link's figures print as they did
    fast = [{**rows[0], "time_s": 1e-5}]
    annotate(fast, 4, None)
    assert footer(fast)[1] == "# Avg bus bandwidth    : ring 1.229 Gbit/s"
