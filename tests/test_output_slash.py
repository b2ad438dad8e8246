"""An output path typed as a folder's ("out/") is refused before any work. typer's Path (and
check_writable's own Path()) dropped the "/": `gradwire advise --json out/`, with no folder
"out", wrote the result to a file named "out", and replaced a file "out" that was there."""

from pathlib import Path

import pytest
from conftest import cli_error, one_line_cli_error

from gradwire.errors import GradwireError


def said(err: str) -> str:
    return " ".join(err.split())


def test_check_writable_refuses_a_name_typed_as_a_folder(monkeypatch, tmp_path):
    from gradwire.jsonfile import check_writable

    monkeypatch.chdir(tmp_path)
    for typed, tail, example in (("x/", "/", "x/result.json"), ("a/b/", "/", "a/b/result.json"),
                                 ("a/b//", "/", "a/b/result.json"),
                                 ("x/.", "/.", "x/result.json")):
        with pytest.raises(GradwireError) as e:
            check_writable(typed, "--json")
        assert str(e.value) == (f"--json {typed!r} names a folder (it ends in {tail}): give a "
                                f"file name, such as {example}")
    (tmp_path / "f").write_text("kept")
    with pytest.raises(GradwireError, match=r"^--plot 'f/' names a folder .* such as "
                                            r"f/figure\.png$"):
        check_writable("f/", "--plot")  # not the file "f", which the result replaced
    assert (tmp_path / "f").read_text() == "kept"
    # everything else as it was: a name, a folder that is there (slash or not), a Path
    assert check_writable("x", "--json") == Path("x")
    assert check_writable(tmp_path / "x.json", "--json") == tmp_path / "x.json"
    (tmp_path / "d").mkdir()
    for typed in ("d", "d/"):
        with pytest.raises(GradwireError, match=r"^--json 'd' is a directory: give a file name$"):
            check_writable(typed, "--json")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.json").exists()


@pytest.fixture
def nothing_runs(monkeypatch, no_cluster):
    """A refusal that came too late (a cluster, a measurement or a recording started) fails
    the test instead of running the work."""
    import gradwire.cli.bench
    import gradwire.profiles.measure
    import gradwire.sim.edit

    def started(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(gradwire.cli.bench, "cluster_for", started)
    monkeypatch.setattr(gradwire.profiles.measure, "measure", started)
    monkeypatch.setattr(gradwire.sim.edit, "make_trace", started)


@pytest.mark.parametrize(("args", "option", "typed", "example"), [
    (["advise", "--model", "resnet50", "--workers", "32", "--bandwidth", "10gbit", "--json"],
     "--json", "out/", "out/result.json"),
    (["whatif", "--workers", "4", "--json"], "--json", "out/", "out/result.json"),
    (["whatif", "--workers", "4", "--plot"], "--plot", "out/", "out/figure.png"),
    (["bench", "--json"], "--json", "out/", "out/result.json"),
    (["calibrate", "--device", "cpu", "--out"], "--out", "out/", "out/result.json"),
    (["profile", "--model", "mlp", "--out"], "--out", "out/", "out/result.json"),
    (["train", "--checkpoint"], "--checkpoint", "out/", "out/checkpoint.pt"),
    (["train", "--json"], "--json", "a/b/", "a/b/result.json"),
    (["train", "--plot"], "--plot", "out/", "out/figure.png"),
    (["demo", "--plot"], "--plot", "out/", "out/figure.png"),
    (["trace", "--model", "mlp", "-o"], "--out", "out/", "out/result.json"),
    (["simulate", "--trace", "t.jsonl", "--timeline"], "--timeline", "out/",
     "out/timeline.json"),
    (["simulate", "--trace", "t.jsonl", "--json"], "--json", "out/.", "out/result.json"),
])
def test_commands_refuse_an_output_typed_as_a_folder(monkeypatch, capsys, tmp_path, nothing_runs,
                                                     args, option, typed, example):
    monkeypatch.chdir(tmp_path)
    code, err = cli_error(monkeypatch, capsys, *args, typed)
    tail = "/." if typed.endswith(".") else "/"
    one_line_cli_error(code, said(err), f"{option} {typed!r} names a folder (it ends in "
                                        f"{tail}): give a file name, such as {example}")
    assert list(tmp_path.iterdir()) == []  # no file "out" (nor "a") written


def test_train_checkpoint_slash_is_not_taken_for_an_existing_file(monkeypatch, capsys, tmp_path,
                                                                  no_cluster):
    """"ck/" where a file "ck" is: refused as a folder's name, not as the file that exists
    (whose message said to --resume from it)."""
    (tmp_path / "ck").write_text("not a checkpoint")
    code, err = cli_error(monkeypatch, capsys, "train", "--checkpoint", f"{tmp_path}/ck/")
    one_line_cli_error(code, said(err), "names a folder (it ends in /)")
    assert "exists" not in err


@pytest.mark.parametrize("option", ["--out", "--checkpoint"])
def test_the_worker_refuses_an_output_typed_as_a_folder(monkeypatch, capsys, tmp_path, option):
    """The rank-side entry point (torchrun -m gradwire.train.worker) refuses it the same way."""
    from gradwire.train import worker

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as e:
        worker.parse_args(["--model", "mlp-small", option, "out/"])
    err = said(capsys.readouterr().err)
    name = "checkpoint.pt" if option == "--checkpoint" else "result.json"
    assert e.value.code == 2
    assert err.endswith(f"error: {option} 'out/' names a folder (it ends in /): give a file "
                        f"name, such as out/{name}"), err
    assert list(tmp_path.iterdir()) == []


def test_calibrate_s_rank_side_refuses_an_output_typed_as_a_folder(monkeypatch, capsys,
                                                                    tmp_path):
    """torchrun -m gradwire.bench.calibrate --out out/ wrote a file named out: its --out was
    read as a Path, which drops the slash."""
    from gradwire.bench import calibrate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as e:
        calibrate.main(["--out", "out/", "--device", "cpu"])
    err = said(capsys.readouterr().err)
    assert e.value.code == 2
    assert err.endswith("error: --out 'out/' names a folder (it ends in /): give a file name, "
                        "such as out/result.json"), err
    assert list(tmp_path.iterdir()) == []
