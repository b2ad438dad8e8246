"""Two lines a user reads after a slip: bench's ``-b 8K`` (nccl-tests' begin size, bench's
--bandwidth) says what takes sizes here; whatif's "not predicted" line says "every worker count
asked" for a method refused at each, and cuts a long list of counts, while its --json record
keeps every count."""

from __future__ import annotations

import json

import calibration_doc
import pytest
from conftest import Started, cli_error, one_line_cli_error, run_cli, start_here

from gradwire.cli import options

SIZES_HINT = "; nccl-tests' -b, -e and -f are --sizes MIN:MAX[:FACTOR] here (-b is --bandwidth)"
NOT_A_RATE = "is not valid: expected a rate like 100mbit"


@pytest.fixture
def no_cluster(monkeypatch):
    """bench never starts a cluster here: where its checks all pass, it raises Started."""
    start_here(monkeypatch, "gradwire.cli.bench", "cluster_for")


@pytest.mark.parametrize("size", ["8", "8K", "128M", "1G", "64kb"])
def test_bench_bandwidth_that_reads_as_a_size_names_sizes(no_cluster, monkeypatch, capsys,
                                                           size):
    code, err = cli_error(monkeypatch, capsys, "bench", "-n", "2", "-b", size)
    one_line_cli_error(code, err, f"bandwidth '{size}' {NOT_A_RATE}")
    assert err.rstrip().endswith(SIZES_HINT), err
    # the long option too: the value, not the option's name, is what reads as a size
    code, err = cli_error(monkeypatch, capsys, "bench", "--bandwidth", size)
    one_line_cli_error(code, err, SIZES_HINT)


def test_only_a_size_gets_the_hint_and_only_in_bench(no_cluster, monkeypatch, capsys):
    code, err = cli_error(monkeypatch, capsys, "bench", "-n", "2", "-b", "8K")
    one_line_cli_error(code, err, SIZES_HINT)
    # not a size (nor 0, which --sizes refuses): the message as before
    for rate in ("fast", "0", "8kbit8", "1K:64M"):
        code, err = cli_error(monkeypatch, capsys, "bench", "-n", "2", "-b", rate)
        one_line_cli_error(code, err, f"bandwidth '{rate}' {NOT_A_RATE}")
        assert "nccl-tests" not in err, err
    # a rate bench takes still reaches the run
    code, _, err = run_cli(monkeypatch, capsys, ["bench", "-n", "2", "-b", "8mbit"], (Started,))
    assert code == 0, err
    # calibrate shares -b but takes no --sizes: nothing to point at
    code, err = cli_error(monkeypatch, capsys, "calibrate", "-b", "8K", "--device", "cpu")
    one_line_cli_error(code, err, f"bandwidth '8K' {NOT_A_RATE}")
    assert "nccl-tests" not in err, err


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(options.console, "width", 1000)
    return tmp_path


def _whatif(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    code, out, err = run_cli(monkeypatch, capsys, ["whatif", "--model", "resnet50",
                                                   "--bandwidth", "10gbit", *args])
    return code, " ".join(out.split()), err


WHY = "ranks leave no level to send"


@pytest.mark.parametrize("workers", ["130:1024:2", "520,130,260,130,520"])
def test_a_method_refused_at_every_count_asked_says_so(home, monkeypatch, capsys, workers):
    js = home / "w.json"
    code, out, err = _whatif(monkeypatch, capsys, "--workers", workers, "--agg", "int8,dense",
                             "--json", str(js))
    assert code == 0, err
    assert f"not predicted: int8 at every worker count asked (130 to 520): 130 {WHY}" in out
    assert "130, 260" not in out
    # the record machines read keeps every count
    (entry,) = json.loads(js.read_text())["not_predicted"]
    assert entry["agg"] == "int8" and entry["workers"] == [130, 260, 520]
    assert entry["reason"].startswith(f"130 {WHY}")


def test_a_long_list_of_refused_counts_is_cut_but_recorded_whole(home, monkeypatch, capsys):
    table = home / "int8.json"  # a table that prices int8: refused only beyond 127 ranks
    table.write_text(json.dumps(calibration_doc.codecs(("dense", "int8"))))
    js = home / "w.json"
    asked = list(range(100, 160, 2))  # 30 counts, int8 refused at the 16 from 128
    code, out, err = _whatif(monkeypatch, capsys, "--workers", ",".join(map(str, asked)),
                             "--agg", "int8,dense", "--codecs", str(table), "--json", str(js))
    assert code == 0, err
    assert f"not predicted: int8 at 128, 130, 132, …, 158 workers (16 of 30 asked): 128 {WHY}" \
        in out
    # the counts the line names (the run's paths after it may hold any digits: pytest-134)
    assert "134" not in out.split("not predicted")[1].split("asked)")[0]
    doc = json.loads(js.read_text())
    (entry,) = doc["not_predicted"]
    assert entry["workers"] == list(range(128, 160, 2))
    assert doc["workers"] == asked  # every count asked, once


def test_nothing_predicted_says_every_count_in_its_one_line(home, monkeypatch, capsys):
    code, _, err = _whatif(monkeypatch, capsys, "--workers", "128:4096:2", "--agg", "int8")
    one_line_cli_error(code, err, "no aggregation scheme could be predicted: int8 at every "
                       f"worker count asked (128 to 4096): 128 {WHY}")
    assert "256" not in err, err
