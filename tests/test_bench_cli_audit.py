"""`gradwire bench` as an nccl-tests user runs it: what a Ctrl-C part way leaves on screen, and
what the model column assumes for links that are not shaped. Each runs in this process, the
ranks' launch replaced."""

import json
import signal

from conftest import run_cli

from gradwire.interrupts import Interrupted

ROW = {"collective": "allreduce", "algo": "ring", "name": "ring", "params": {}, "count": 256,
       "bytes": 1024, "type": "float32", "redop": "sum", "time_s": 2e-3, "wrong": 0,
       "header": False}


def test_a_ctrl_c_part_way_shows_the_rows_measured_before(monkeypatch, capsys, tmp_path):
    """A sweep stopped with Ctrl-C after its first size printed no row: the measured rows
    went with the ranks, where nccl-tests would have printed them (as bench does when a rank
    fails)."""
    import gradwire.jobs
    from gradwire.cli import options

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    monkeypatch.setattr(options.console, "width", 1000)  # the table's cells whole

    def interrupted_at_the_second_size(cluster, cmd, timeout, sink):
        sink(f"[rank 0] GW_BENCH {json.dumps(ROW)}")
        raise Interrupted(signal.SIGINT, 2)  # as a launch raises it, its ranks stopped

    monkeypatch.setattr(gradwire.jobs, "launch", interrupted_at_the_second_size)
    code, out, err = run_cli(monkeypatch, capsys, [
        "bench", "--loopback", "--hosts", "2", "--sizes", "1K,2K", "--algo", "ring",
        "--no-builtin"])
    assert code == 130 and "interrupted by SIGINT; stopped 2 ranks" in err, (code, err)
    text = " ".join(out.split())
    assert "1 of 2 rows measured before the interrupt" in text, text
    assert " 1K 256 float32 sum ring 2000.0 " in text, text


def test_the_nominal_model_says_what_rate_it_assumes_on_links_not_shaped(monkeypatch,
                                                                         tmp_path):
    """On loopback (and --bandwidth none) the model priced β at 10 Gbit/s while the title
    said "link rate", of links that have none."""
    from gradwire.bench.run import model_params
    from gradwire.cluster.state import Cluster, Host, loopback_cluster

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))  # no calibration: nominal terms
    params, source = model_params(loopback_cluster(2))
    assert params.beta == 8 / 10e9
    assert "10gbit assumed (links not shaped)" in source and "link rate" not in source
    shaped = Cluster("gw0aa0c4", 1e9, [Host(0, "gw0aa0c4-h0", "10.213.9.1", "eth0")])
    params, source = model_params(shaped)
    assert params.beta == 8 / 1e9 and "link rate" in source and "assumed" not in source


def test_a_second_ctrl_c_during_the_partial_table_keeps_the_first_one_s_line(
        monkeypatch, capsys, tmp_path):
    """A second Ctrl-C while bench printed the rows measured before the first one replaced
    the first's line: "stopped 2 ranks" was lost."""
    import gradwire.jobs
    from gradwire.cli import options

    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    printed = options.console.print

    def second_ctrl_c(*args, **kwargs):
        if any("measured before the interrupt" in str(getattr(a, "title", "")) for a in args):
            raise KeyboardInterrupt
        printed(*args, **kwargs)

    def interrupted_at_the_second_size(cluster, cmd, timeout, sink):
        sink(f"[rank 0] GW_BENCH {json.dumps(ROW)}")
        raise Interrupted(signal.SIGINT, 2)

    monkeypatch.setattr(options.console, "print", second_ctrl_c)
    monkeypatch.setattr(gradwire.jobs, "launch", interrupted_at_the_second_size)
    code, _, err = run_cli(monkeypatch, capsys, [
        "bench", "--loopback", "--hosts", "2", "--sizes", "1K,2K", "--algo", "ring",
        "--no-builtin"])
    assert code == 130 and "interrupted by SIGINT; stopped 2 ranks" in err, (code, err)
