"""Edges of the training worker, its checkpoints and the CLI around them: bad environment,
two options naming one file, a signal during a checkpoint's write."""

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import cli_error, one_line_cli_error

QUICK = ["--loopback", "--hosts", "2", "--model", "mlp-small", "--batch-size", "64"]


@pytest.mark.parametrize("world", ["abc", "", "0", "-2", "²"])
def test_the_worker_refuses_a_world_size_that_is_no_whole_number(monkeypatch, capsys, world):
    """WORLD_SIZE is read before the process group, where every setting is checked: "abc"
    was a ValueError traceback, "0" a ZeroDivisionError one, "-2" a batch larger than a
    share of -719 samples."""
    from gradwire.train import worker

    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "error: WORLD_SIZE must be a whole number >= 1" in err.strip().splitlines()[-1]
    assert repr(world) in err


@pytest.mark.parametrize("env,args,expected", [
    ("7", [], 7.0),              # GRADWIRE_TIMEOUT sets the worker's collectives' limit
    (None, [], 60.0),            # neither given: the documented 60 s
    ("7", ["--timeout", "3"], 3.0),  # --timeout overrides it
])
def test_the_workers_collectives_follow_gradwire_timeout(monkeypatch, env, args, expected):
    """The hooks' calls and the launcher's wait for the other ranks follow GRADWIRE_TIMEOUT;
    the worker's own collectives (barriers, the epoch's sums, the checkpoint's gather) had
    kept 60 s whatever it said, so a user who raised it for a slow rank 0 was still cut off."""
    from gradwire.train import worker

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if env is None:
        monkeypatch.delenv("GRADWIRE_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("GRADWIRE_TIMEOUT", env)
    assert worker.parse_args(["--model", "mlp-small", *args]).timeout == expected


def test_the_worker_refuses_a_bad_gradwire_timeout_in_one_line(monkeypatch, capsys):
    from gradwire.train import worker

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("GRADWIRE_TIMEOUT", "nan")
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2, err
    assert err[-1].endswith("error: GRADWIRE_TIMEOUT must be a number of seconds from 0.001 "
                            "to 2e+06, got 'nan'"), err


def test_the_worker_started_without_a_launcher_says_so_in_one_line(monkeypatch, capsys):
    """No RANK or MASTER_ADDR (the worker run by hand): one line that names what starts it,
    not torch's rendezvous traceback."""
    from gradwire.train import worker

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["worker", "--model", "mlp-small"])
    assert worker._main() == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gradwire train: error: cannot join"), err
    assert "RANK" in err and "gradwire run or torchrun" in err


@pytest.mark.parametrize("through", ["same", "link"])
def test_the_worker_refuses_out_and_checkpoint_in_one_file(monkeypatch, capsys, tmp_path,
                                                           through):
    """The result JSON, written last, replaced the checkpoint; a resume then found none."""
    from gradwire.train import worker

    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    ck = tmp_path / "real" / "run.pt"
    out = ck if through == "same" else tmp_path / "link" / "run.pt"
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small", "--out", str(out), "--checkpoint", str(ck)])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "--out and --checkpoint name the same file" in err.strip().splitlines()[-1], err


SAVE_UNDER_SIGTERM = textwrap.dedent("""
    import datetime, os, signal, sys
    import torch, torch.distributed as dist
    from gradwire.train import worker

    folder = sys.argv[1]
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))

    def save(obj, f):  # part of the file is written when the launcher's SIGTERM comes
        with open(f, "wb") as fh:
            fh.write(b"half a checkpoint")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # a few more steps of the write
            pass

    class Agg:
        def state_dict(self):
            return {}

    torch.save = save
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    worker.save_checkpoint(os.path.join(folder, "my ck.pt"), model, opt, Agg(), {}, 1, {})
    print("SAVED")
""")


def test_a_sigterm_during_a_checkpoint_s_write_leaves_no_temporary_file(tmp_path):
    """A launcher stops its ranks with SIGTERM; one that came while rank 0 wrote its checkpoint
    ended the process at once, and a ``.NAME.PID.tmp`` as large as the checkpoint stayed in
    the user's folder."""
    folder = tmp_path / "ck dir"
    folder.mkdir()
    res = subprocess.run([sys.executable, "-c", SAVE_UNDER_SIGTERM, str(folder)],
                         capture_output=True, text=True, timeout=60)
    assert "SAVED" not in res.stdout
    assert res.returncode == -signal.SIGTERM, res.stderr  # as the signal ends a rank
    assert "Traceback" not in res.stderr, res.stderr
    assert sorted(p.name for p in folder.iterdir() if p.name != "store") == []


@pytest.mark.parametrize("columns", ["²", "9" * 5000])
def test_a_columns_that_int_cannot_read_is_the_default_width(monkeypatch, columns):
    """COLUMNS is read when the CLI is imported: "²" (a digit to str.isdigit, not to int())
    and 5000 digits (past int()'s limit) were a ValueError traceback before any command."""
    from gradwire.cli import options

    monkeypatch.setenv("COLUMNS", columns)
    assert options._piped_width() == options.WIDTH


def test_outputs_that_are_one_file_through_a_link_are_refused(monkeypatch, capsys, tmp_path,
                                                              no_cluster):
    """--json and --checkpoint spelled through a link to one folder: one write went over the
    other (the checkpoint replaced by the result, or the other way round)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--epochs", "1",
                          "--json", str(tmp_path / "real" / "run.out"),
                          "--checkpoint", str(tmp_path / "link" / "run.out"))
    one_line_cli_error(code, err, "--json and --checkpoint name the same file")


def test_an_os_error_naming_a_file_with_a_line_break_is_one_line(monkeypatch, capsys):
    """The CLI's line for an OSError the checks could not foresee shows a line break in the
    file's name escaped, as it does in its other errors."""
    import gradwire.cli.train

    def gone(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "run\nfolder/x.json")

    monkeypatch.setattr(gradwire.cli.train, "ephemeral_cluster", gone)
    code, err = cli_error(monkeypatch, capsys, "train", *QUICK, "--epochs", "1")
    one_line_cli_error(code, err, "run\\nfolder/x.json: No such file or directory")


def test_ranks_that_fail_together_are_drained_within_one_wait(monkeypatch):
    """Each failed rank's output was waited for 1 s, one rank after another: where many ranks
    failed together and children of theirs held their pipes open, the others were stopped a
    minute late. The ranks of one poll now share one wait."""
    from gradwire import launcher

    clock = [0.0]
    monkeypatch.setattr(launcher.time, "monotonic", lambda: clock[0])

    class Held:  # a reader whose pipe a child keeps open: join waits out its whole timeout
        def join(self, timeout=None):
            clock[0] += timeout

    out = launcher._Output(lambda line: None, 60)
    out.threads = {r: Held() for r in range(60)}
    out.drain(list(range(60)))
    out.drain(list(range(60)))  # once per rank
    assert clock[0] <= launcher.DRAIN_S


def test_a_checkpoint_that_cannot_be_read_says_why(tmp_path):
    """An unreadable path was reported as "not a gradwire checkpoint (NotADirectoryError)":
    the file was never read, and the line named no reason a user could act on."""
    from gradwire.errors import GradwireError
    from gradwire.train import checkpoint

    (tmp_path / "file").write_text("x")
    with pytest.raises(GradwireError, match="cannot read checkpoint .*Not a directory"):
        checkpoint.load(tmp_path / "file" / "ck.pt")
