"""Edges of a training run's report: rank 0's progress and result as run_ranks reads them,
and the figure of a run of one epoch."""

import io
import math

import pytest
from rich.console import Console

from gradwire import jobs
from gradwire.cluster import loopback_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import PROGRESS, RunResult, _Output


def _fake_launch(ranks: int, lines: list[str], result: bytes | None):
    """A launch whose rank 0 prints ``lines`` through the launcher's own output reader (its
    ``[rank i]`` prefixes) and writes ``result`` to ``--out``."""

    def launch(cluster, cmd, timeout=None, sink=None, **kwargs):
        output = _Output(sink, ranks)
        output.follow(0, io.StringIO("".join(f"{line}\n" for line in lines)))
        output.close()
        if result is not None:
            with open(cmd[cmd.index("--out") + 1], "wb") as f:
                f.write(result)
        return RunResult(0, "", [])

    return launch


def test_rank_0_s_progress_is_read_at_eleven_ranks(monkeypatch, capsys):
    """From 11 ranks the launcher pads rank numbers ("[rank  0]"): rank 0's progress lines
    are still its progress, not output kept for an error report."""
    monkeypatch.setattr(jobs, "launch", _fake_launch(11, [f"{PROGRESS} {i} 4" for i in
                                                         range(1, 5)], b"{}"))
    console = Console(file=io.StringIO())  # not a terminal: progress as lines on stderr
    assert jobs.run_ranks(loopback_cluster(2), "m", [], "train", None, console) == {}
    err = capsys.readouterr().err
    assert "train: 4/4 done" in err, err


@pytest.mark.parametrize("written", [b'{"loss": [1.0', b"", b'{"agg": "\xff"}'])
def test_a_result_that_is_no_json_is_one_line_naming_rank_0(monkeypatch, written):
    monkeypatch.setattr(jobs, "launch", _fake_launch(2, [], written))
    with pytest.raises(GradwireError, match=r"^train failed: rank 0's result is not valid"):
        jobs.run_ranks(loopback_cluster(2), "m", [], "train", None, Console(quiet=True))


def test_a_result_that_is_no_object_is_one_line(monkeypatch):
    from gradwire.train import job

    monkeypatch.setattr(job, "run_ranks", lambda *a, **k: [1, 2])
    with pytest.raises(GradwireError, match="dense failed: rank 0's result is a JSON array"):
        job.train_on(loopback_cluster(2), job.TrainConfig(), "dense", None,
                     Console(quiet=True))


def test_one_epoch_s_figure_counts_whole_epochs(monkeypatch, tmp_path):
    from gradwire import report

    figs = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi: figs.append(fig))
    result = {"agg": "dense", "loss": [2.0], "test_accuracy": [0.5], "epoch_wall_s": [1.0]}
    report.plot_curves([result], tmp_path / "c.png", "one epoch")
    fig = figs[0]
    fig.canvas.draw()
    axis = fig.axes[2]  # loss against epoch: the epoch axis the figure labels
    lo, hi = axis.get_xlim()
    ticks = [t for t in axis.get_xticks() if lo <= t <= hi]
    assert ticks == [1.0] and all(t == math.floor(t) for t in ticks), ticks
