"""Edges of a training run's plumbing: the worker's arguments as `gradwire train` hands them
over, and the files the worker writes."""

import errno
import io
from pathlib import Path

import pytest

from gradwire.train.job import TrainConfig


def test_a_checkpoint_named_like_an_option_reaches_the_worker(monkeypatch, tmp_path):
    """`gradwire train --checkpoint -ck.pt` is accepted on the host; the ranks' argparse must
    take the same name as the value of --checkpoint, not refuse it as an unknown option once
    the cluster is up."""
    from gradwire.train import worker

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = TrainConfig(model="mlp-small", batch_size=64, checkpoint=Path("-ck.pt"))
    assert worker.parse_args(cfg.worker_args()).checkpoint == "-ck.pt"


def test_the_worker_s_out_is_replaced_whole(monkeypatch, tmp_path, capsys):
    """A write of --out that fails half way (a disk that fills) leaves the file that was
    there, as every other gradwire output does, instead of a truncated result."""
    import builtins

    from gradwire.train import worker

    monkeypatch.setattr(worker.dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(worker.dist, "destroy_process_group", lambda *a, **k: None)
    monkeypatch.setattr(worker, "prepare", lambda args: None)
    monkeypatch.setattr(worker, "train", lambda args, prepared: {"loss": [1.0] * 1000})
    out = tmp_path / "w.json"
    out.write_text('{"old": 1}\n')
    real_open = builtins.open

    class Full(io.TextIOWrapper):
        def write(self, s):
            super().write(s[: len(s) // 2])
            self.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_open(file, mode="r", *args, **kwargs):
        if "w" in mode and Path(file).parent == tmp_path:
            return Full(real_open(file, "wb"))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_open)
    with pytest.raises(worker.GradwireError, match="cannot write --out"):
        worker.main(["--model", "mlp-small", "--out", str(out)])
    monkeypatch.setattr(builtins, "open", real_open)
    assert out.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"]  # no temporary file left


def test_a_diverged_run_is_reported_not_a_traceback(tmp_path):
    """A loss that went NaN reaches the report as None (result files are strict JSON): the
    table shows nan, and the figure leaves a gap, instead of failing after the whole run."""
    from rich.console import Console

    from gradwire.report import plot_curves, results_table

    result = {"agg": "dense", "data": "text", "samples_per_s": 100.0,
              "seconds_per_iter": {"compute": 0.01, "compress": 0.0, "communicate": 0.02,
                                   "step": 0.001},
              "wire_tx_bytes_per_iter_per_rank": None, "payload_bytes_per_iter_per_rank": 1e6,
              "wall_s": 3.0, "loss": [2.0, None], "test_loss": [2.1, None],
              "test_accuracy": [0.5, 0.1], "epoch_wall_s": [1.0, 2.0]}
    console = Console(record=True, width=160)
    console.print(results_table([result], "diverged"))
    row = console.export_text().splitlines()[-2].split()
    assert row[-4:] == ["nan", "nan", "10.0", "%"], row
    assert plot_curves([result], tmp_path / "c.png", "diverged").stat().st_size > 0


def test_the_speed_up_column_shows_only_beside_another_method():
    """A run of one method showed "speed-up 1.00×", its speed over itself."""
    from rich.console import Console

    from gradwire.report import results_table

    row = {"agg": "dense", "samples_per_s": 100.0, "wall_s": 3.0, "loss": [2.0],
           "seconds_per_iter": dict.fromkeys(("compute", "compress", "communicate", "step"),
                                             0.01),
           "wire_tx_bytes_per_iter_per_rank": 1e6, "payload_bytes_per_iter_per_rank": 1e6,
           "test_accuracy": [0.5]}
    shown = []
    for rows in ([row], [row, {**row, "agg": "fp16", "samples_per_s": 250.0}]):
        console = Console(record=True, width=160)
        console.print(results_table(rows, "t"))
        shown.append(console.export_text())
    assert "speed-up" not in shown[0] and "1.00×" not in shown[0]
    assert "speed-up" in shown[1] and "2.50×" in shown[1]
