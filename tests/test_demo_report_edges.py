"""The demo's and train's reports, and `gradwire cluster status`, where they told the user less
than what happened: bad input that printed notes before its one line, a comparison whose
baseline failed, a --json that could not be written costing the figure, and clusters left out
of the status. Each runs in this process, with training replaced where it would start."""
import errno
import json

import pytest
from conftest import Started, cli_error, run_cli


def _result(agg: str, samples_per_s: float = 100.0) -> dict:
    return {"agg": agg, "density": 0.001, "density_per_epoch": [0.001, 0.001],
            "model": "mlp-small", "parameters": 1000, "world_size": 2,
            "samples_per_s": samples_per_s, "wire_tx_bytes_per_iter_per_rank": None,
            "payload_bytes_per_iter_per_rank": 4000, "wall_s": 1.0, "loss": [2.0, 1.0],
            "test_accuracy": [0.5, 0.7], "epoch_wall_s": [0.5, 1.0],
            "seconds_per_iter": dict.fromkeys(("compute", "compress", "communicate", "step"),
                                              0.01)}


def _demo_fails(monkeypatch, failing: set[str]) -> None:
    import gradwire.demo
    from gradwire.errors import GradwireError

    def train_on(cluster, cfg, label, timeout, console):
        if label in failing:
            raise GradwireError(f"{label} failed: rank 1 exited with code 1")
        return _result(label, {"dense": 100.0, "topk": 300.0, "gtopk": 400.0}[label])

    monkeypatch.setattr(gradwire.demo, "train_on", train_on)


def _no_training(monkeypatch) -> None:
    import gradwire.demo
    import gradwire.train.job

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(gradwire.demo, "train_on", started)
    monkeypatch.setattr(gradwire.train.job, "run_ranks", started)


# ---- --mtu: checked with the other options, before the warm-up notes


@pytest.mark.parametrize("command", ["train", "demo"])
def test_a_bad_mtu_is_one_line_not_notes_then_the_error(monkeypatch, capsys, tmp_path,
                                                        command):
    """--mtu was checked only when the cluster was made: after the warm-up notes (two of them
    for the demo's topk and gtopk), so bad input printed three lines, two about a run that
    would never start."""
    _no_training(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code, err = cli_error(monkeypatch, capsys, command, "--loopback", "--hosts", "2",
                          "--model", "mlp-small", "--epochs", "1", "--agg",
                          "topk" if command == "train" else "dense,topk,gtopk", "--mtu", "1")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("gradwire: error: --mtu must be an integer number of bytes")


def test_a_good_mtu_still_reaches_the_run(monkeypatch, capsys, tmp_path):
    import gradwire.cli.train

    made = {}

    def cluster(hosts, bandwidth, loopback, mtu, progress=None):
        made["mtu"] = mtu
        raise Started

    monkeypatch.setattr(gradwire.cli.train, "ephemeral_cluster", cluster)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, ["train", "--hosts", "2", "--model",
                                                 "mlp-small", "--epochs", "1", "--mtu",
                                                 "9000"], started=(Started,))
    assert code == 0 and made == {"mtu": 9000}, err


# ---- the demo: a failed baseline, and a --json that could not be written


def test_a_failed_baseline_says_what_the_speed_ups_are_over(monkeypatch, capsys, tmp_path):
    """dense, the first method and the speed-up column's baseline, failed: the table's first
    row, and so its 1.00×, became topk's, and nothing said so (topk 3× faster than dense read
    as 1.00×, gtopk as 1.33×)."""
    _demo_fails(monkeypatch, {"dense"})
    code, stdout, err = run_cli(monkeypatch, capsys, [
        "demo", "--loopback", "--hosts", "2", "--agg", "dense,topk,gtopk", "--plot",
        str(tmp_path / "d.png")])
    assert code == 2, stdout + err
    assert "their speed-ups are over topk, not dense" in " ".join(err.split()), err
    assert "1 of 3 methods failed (dense failed" in " ".join(err.split()), err


def test_a_failure_after_the_baseline_keeps_the_line_as_it_was(monkeypatch, capsys, tmp_path):
    _demo_fails(monkeypatch, {"topk"})
    code, stdout, err = run_cli(monkeypatch, capsys, [
        "demo", "--loopback", "--hosts", "2", "--agg", "dense,topk,gtopk", "--plot",
        str(tmp_path / "d.png")])
    assert code == 2, stdout + err
    assert "speed-ups are over" not in err, err


def test_a_json_that_cannot_be_written_costs_neither_the_figure_nor_the_failures(
        monkeypatch, capsys, tmp_path):
    """A disk that filled during the demo: --json went elsewhere (and said where), but the
    error skipped the figure, whose path was fine, and hid which method had failed."""
    import gradwire.cli.options

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    _demo_fails(monkeypatch, {"topk"})
    monkeypatch.setattr(gradwire.cli.options, "replace_text", full)
    monkeypatch.chdir(tmp_path)  # where the result is saved instead
    png = tmp_path / "d.png"
    code, stdout, err = run_cli(monkeypatch, capsys, [
        "demo", "--loopback", "--hosts", "2", "--agg", "dense,topk,gtopk", "--json",
        str(tmp_path / "r.json"), "--plot", str(png)])
    assert code == 2, stdout + err
    assert png.read_bytes()[:4] == b"\x89PNG"
    line = " ".join(err.split())
    assert "1 of 3 methods failed (topk failed" in line, err
    assert "could not write" in line and "result saved to" in line, err
    (kept,) = tmp_path.glob("gradwire-r-*.json")
    assert [r["agg"] for r in json.loads(kept.read_text())] == ["dense", "gtopk"]
    assert "Traceback" not in err


# ---- gradwire cluster status: clusters whose state file does not read


@pytest.fixture
def state_dir(monkeypatch, tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(folder))
    return folder


def test_status_names_a_cluster_whose_state_file_does_not_read(monkeypatch, capsys, state_dir):
    """`cluster status` said "no gradwire clusters are up" while `gradwire run --cluster
    gw0abc12` refused that very cluster's unreadable state file, whose namespaces stay until
    `cluster down` removes them."""
    (state_dir / "gw0abc12.json").write_text('{"name": "gw0abc12", "bandwidth_bps": "[b]x"}')
    (state_dir / "gwnotone.json").write_text("{}")  # no name gradwire gives: not a cluster
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status"])
    assert code == 0, err
    text = " ".join(out.split())
    assert "no gradwire clusters are up" not in text, out
    assert "gw0abc12: cluster state file" in text and "is unreadable" in text, out
    assert "gradwire cluster down gw0abc12" in text, out
    assert "gwnotone" not in text, out
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status", "--json"])
    assert code == 0 and json.loads(out) == [], out  # the list holds whole clusters only
    assert "gw0abc12" in err and "is unreadable" in err, err


def test_status_with_nothing_there_still_says_so(monkeypatch, capsys, state_dir):
    code, out, err = run_cli(monkeypatch, capsys, ["cluster", "status"])
    assert code == 0 and "no gradwire clusters are up" in out, out + err


# ---- labels: the setting a row ran at


def test_a_powersgd_row_without_rank_is_labelled_with_the_rank_it_ran_at():
    """`--agg powersgd` without --rank runs at the hook's default rank 4, but its row and
    legend read "powersgd": beside a `--rank 1` run's "powersgd r=1" it looked like another
    method, not PowerSGD at four times the rank."""
    import inspect

    from gradwire.compress import COMPRESSORS
    from gradwire.report import method_label

    default = inspect.signature(COMPRESSORS["powersgd"]).parameters["rank"].default
    assert default == 4  # what train's --help and docs/training.md say
    assert method_label({"agg": "powersgd", "density": 0.001, "rank": None}) == "powersgd r=4"
    assert method_label({"agg": "powersgd", "density": 0.001, "rank": 1}) == "powersgd r=1"
    assert method_label({"agg": "dense", "density": 0.001, "rank": None}) == "dense"
    assert method_label({"agg": "qsgd", "density": 0.001}) == "qsgd"
