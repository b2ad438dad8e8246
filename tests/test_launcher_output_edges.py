"""The launcher and the local executor: a long output line, a caller's torchrun error file, a
launcher killed outright, lines that only look like progress, and buffers that share memory."""
import sys
import time

from gradwire.cluster import loopback_cluster
from gradwire.launcher import launch

TABLE = "import sys\nsys.stdout.write('rank 1, ' * 20_000 + 'END\\n')\n"


def test_a_long_line_naming_many_ranks_reaches_the_sink_at_once():
    """One 160 kB line that names "rank 1" 20 000 times (a per-rank table on one line): the
    search for a PeerError's message in it took time in the square of its length (13 s), so
    the rank's reader handed on nothing, and the launcher gave its output up after 2 s: the
    run "exited 0" without the line."""
    lines: list[str] = []
    t0 = time.monotonic()
    res = launch(loopback_cluster(1), [sys.executable, "-c", TABLE], timeout=30,
                 sink=lines.append)
    assert res.returncode == 0, res.message
    assert lines == ["[rank 0] " + "rank 1, " * 20_000 + "END"]
    assert time.monotonic() - t0 < 5


RECORD = ("from torch.distributed.elastic.multiprocessing.errors import record\n"
          "@record\ndef main():\n    raise RuntimeError('boom in a rank')\nmain()\n")


def test_a_rank_does_not_write_its_error_into_the_callers_torchrun_error_file(tmp_path,
                                                                             monkeypatch):
    """gradwire run from a torchrun worker: the ranks inherited the worker's
    TORCHELASTIC_ERROR_FILE, and a rank's @record wrote its error there, over the worker's
    own (torchrun then reports it as the worker's). torchrun gives each of its ranks its own
    (empty where it keeps no logs); so does the launcher now."""
    outer = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(outer))
    lines: list[str] = []
    res = launch(loopback_cluster(1), [sys.executable, "-c", RECORD], timeout=60,
                 sink=lines.append)
    assert res.returncode == 1 and res.message.startswith("rank 0 exited with status 1")
    assert any("boom in a rank" in line for line in lines), lines
    assert not outer.exists()


PROGRESS_RANK = ("import json, sys\n"
                 "print('GW_PROGRESS 1 2', flush=True)\n"
                 "print('GW_PROGRESS 2/2 steps', flush=True)\n"
                 "print('GW_PROGRESS', flush=True)\n"
                 "json.dump({'ok': True}, open(sys.argv[sys.argv.index('--out') + 1], 'w'))\n")


def test_a_line_that_only_looks_like_progress_does_not_stop_the_run(tmp_path, monkeypatch):
    """Rank 0's ``GW_PROGRESS 2/2 steps`` (or a progress line another thread's output ran
    into): its parsing raised ValueError in the output's sink, which stopped every rank, and
    the run failed with "the ranks' output could not be handed on"."""
    import io

    from rich.console import Console

    from gradwire.jobs import run_ranks

    (tmp_path / "hunt_progress_rank.py").write_text(PROGRESS_RANK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    console = Console(file=io.StringIO(), quiet=True)
    got = run_ranks(loopback_cluster(1), "hunt_progress_rank", [], "hunt", 30, console)
    assert got == {"ok": True}


def _ring(p: int = 4, count: int = 8):
    from gradwire.schedules import registry

    return registry.schedule("allreduce", "ring", p, count)


def test_local_buffers_that_share_memory_are_refused_in_one_line():
    """``[buf] * p``, the list pitfall: every rank's writes landed in one buffer, and an
    allreduce of ones gave 8 on 4 ranks instead of 4, without a word."""
    import pytest
    import torch

    from gradwire.collectives.local import execute_local
    from gradwire.errors import GradwireError

    buf = torch.ones(8)
    with pytest.raises(GradwireError, match=r"^the buffers of ranks 0 and 1 share memory"):
        execute_local(_ring(), [buf] * 4)
    assert buf.tolist() == [1.0] * 8  # refused before anything ran
    whole = torch.ones(33)
    with pytest.raises(GradwireError, match="ranks 2 and 3 share memory"):
        execute_local(_ring(), [whole[:8], whole[8:16], whole[16:24], whole[23:31]])
    # views of one storage whose elements never meet are separate buffers
    parts = [whole[i:32:4] for i in range(4)]
    execute_local(_ring(), parts)
    assert [b.tolist() for b in parts] == [[4.0] * 8] * 4


def test_local_combine_of_the_wrong_length_or_mixed_buffers_are_refused_in_one_line():
    """A ``combine`` list shorter than the world raised a bare IndexError; buffers of mixed
    dtypes failed half-way with torch's cast error."""
    import pytest
    import torch

    from gradwire.collectives.local import execute_local
    from gradwire.errors import GradwireError

    bufs = [torch.ones(8) for _ in range(4)]
    with pytest.raises(GradwireError, match=r"^combine must have one entry per rank, 4 for "
                                            r"this schedule, got 1$"):
        execute_local(_ring(), bufs, combine=[{}])
    mixed = [torch.ones(8, dtype=torch.int64), *bufs[1:]]
    with pytest.raises(GradwireError, match=r"^rank 1: buffer is torch.float32 on cpu, rank "
                                            r"0's is torch.int64 on cpu"):
        execute_local(_ring(), mixed)
    assert mixed[0].tolist() == [1] * 8 and bufs[1].tolist() == [1.0] * 8


LAUNCHER = ("import sys\nfrom gradwire.cluster import loopback_cluster\n"
            "from gradwire.launcher import launch\n"
            "launch(loopback_cluster(2), ['sh', '-c', 'echo PID $$; exec sleep 30'])\n")


def test_the_ranks_die_with_a_launcher_that_is_killed():
    """SIGKILL to the launcher (the OOM killer, a CI job's hard stop) runs no ``finally``:
    its ranks, in sessions of their own, ran on for good."""
    import os
    import re
    import signal
    import subprocess

    from conftest import alive

    p = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        while len(pids) < 2:
            line = p.stdout.readline()
            assert line, "the launcher ended before its ranks started"
            m = re.search(r"PID (\d+)$", line.strip())
            if m:
                pids.append(int(m[1]))
        p.kill()
        p.wait(timeout=10)
        end = time.monotonic() + 5
        while time.monotonic() < end and any(alive(pid) for pid in pids):
            time.sleep(0.05)
        assert not [pid for pid in pids if alive(pid)]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
