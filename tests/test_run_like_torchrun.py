"""`gradwire run` as a torchrun user meets it: a command that no rank could start, and a
stdout or stderr the user closed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import gradwire_cli, needs_netns

from gradwire.cluster import loopback_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import launch


def _refused(cmd, needle, **kw):
    with pytest.raises(GradwireError) as e:
        launch(loopback_cluster(2), cmd, sink=lambda line: None, **kw)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"cannot start {cmd[0]!r}: "), text
    assert needle in text, text


@needs_netns
def test_a_command_not_found_is_one_line_before_a_cluster_is_built():
    """It was each rank's `exec of "X" failed` line on stdout and exit status 1, once a
    cluster had been built for it (on loopback: the `cannot start` line and 2)."""
    res = gradwire_cli("run", "--hosts", "2", "--", "gw-no-such-command-7f3a", "x", timeout=60)
    assert res.returncode == 2 and res.stdout == "", (res.returncode, res.stdout, res.stderr)
    assert res.stderr.splitlines() == [
        "gradwire: error: cannot start 'gw-no-such-command-7f3a': no such command on PATH"]


@pytest.mark.parametrize("mode", [0o644, 0o755], ids=["plain", "executable"])
@pytest.mark.parametrize("given", ["train.py", "./train.py"])
def test_a_python_script_given_as_the_command_says_to_put_python_before_it(
        tmp_path, monkeypatch, mode, given):
    """torchrun puts python before a script; gradwire run starts the command as given. The
    file is there, but exec said "No such file or directory" (not on PATH), "Permission
    denied" or "Exec format error" (no #! line), and in a namespace ip's execvp had the
    shell run the Python code."""
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    path.chmod(mode)
    monkeypatch.chdir(tmp_path)
    _refused([given, "--lr", "0.1"], f"give `-- python {given}`")


@pytest.mark.parametrize("cmd,needle", [
    (["cd", "/tmp"], "shell builtin"),
    (["source", "env.sh"], "shell builtin"),
    ([""], "the command's name is empty"),
    (["/"], "folder"),
])
def test_a_command_that_is_no_program_says_what_it_is(cmd, needle):
    _refused(cmd, needle)


def test_a_file_that_is_not_executable_says_so(tmp_path):
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o644)
    _refused([str(tool)], "not executable")


@pytest.mark.parametrize("mode,needle", [(0o755, "is `./gw-tool-7f3a`, or"),
                                         (0o644, "once `chmod +x gw-tool-7f3a`")])
def test_a_file_of_this_folder_named_without_its_folder_is_not_on_path(tmp_path, monkeypatch,
                                                                       mode, needle):
    """exec looks a name without a / up on PATH only, not in the current folder."""
    tool = tmp_path / "gw-tool-7f3a"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(mode)
    monkeypatch.chdir(tmp_path)
    _refused(["gw-tool-7f3a"], needle)


@pytest.mark.parametrize("line,needle", [
    (b"#!/gw-no-such-dir-7f3a/python", "names '/gw-no-such-dir-7f3a/python', which is not a "
                                       "program here; fix the line"),
    (b"#!/bin/sh\r", "(the line ends in a Windows \\r: save the file with Unix line ends)"),
], ids=["missing", "crlf"])
def test_a_script_whose_interpreter_is_not_there_says_so_before_any_rank(tmp_path, line,
                                                                          needle):
    """Its #! line names no program: exec said "No such file or directory" of the script,
    which is there, and in a namespace every rank said so and exited 1 once the cluster was
    built."""
    tool = tmp_path / "tool"
    tool.write_bytes(line + b"\necho hi\n")
    tool.chmod(0o755)
    _refused([str(tool)], needle)


def test_commands_that_exec_finds_still_run(tmp_path):
    """A script with its #! line by its path, a program on a PATH given to the ranks only, and
    Python given a script: the check refuses only what exec would."""
    tool = tmp_path / "gw-tool-7f3a"
    tool.write_text("#!/bin/sh\necho tool $RANK\n")
    tool.chmod(0o755)
    script = tmp_path / "s.py"
    script.write_text("#!/usr/bin/env python3\nimport os\nprint('py', os.environ['RANK'])\n")
    script.chmod(0o755)
    path = {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    for cmd, env, want in (([str(tool)], None, "tool"), (["gw-tool-7f3a"], path, "tool"),
                           ([str(script)], None, "py"), ([Path(sys.executable), str(script)],
                                                         None, "py")):
        lines: list[str] = []
        res = launch(loopback_cluster(2), cmd, timeout=60, sink=lines.append, extra_env=env)
        assert res.returncode == 0, (cmd, lines)
        assert sorted(lines) == [f"[rank 0] {want} 0", f"[rank 1] {want} 1"], (cmd, lines)


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
@pytest.mark.parametrize("module", ["gradwire", "gradwire.cli"])
def test_a_closed_stdout_or_stderr_is_output_to_nowhere_not_a_traceback(closed, module):
    """`gradwire run ... >&-`: sys.stdout is None, and the console made at import read its
    isatty() (AttributeError, a traceback before any command ran)."""
    py = sys.executable
    script = (f"{py} -m {module} models {closed} || echo models-failed >&3; "
              f"{py} -m {module} run --loopback --hosts 2 -- {py} -c 'print(1)' {closed} "
              "|| echo run-failed >&3")
    r = subprocess.run(["sh", "-c", script + " 3>&2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "failed" not in r.stderr, r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_file_exec_cannot_run_is_refused_and_one_it_can_run_is_taken(tmp_path, monkeypatch):
    """The check told programs from scripts by the name only: a shell script with no #! line
    and no .py passed it, then failed on loopback ("Exec format error") while a namespace's
    shell ran it; a program named x.py was refused though exec runs it. An empty PATH is the
    current folder to exec, and was "not on PATH" to the check."""
    plain = tmp_path / "noext"
    plain.write_text("echo hi\n")
    plain.chmod(0o755)
    _refused([str(plain)], f"it has no #! line and is no program: give its interpreter "
                           f"(`-- sh {plain}`)")
    program = tmp_path / "elf.py"
    program.write_bytes(Path("/bin/true").read_bytes())
    program.chmod(0o755)
    tool = tmp_path / "gw-here-7f3a"
    tool.write_text("#!/bin/sh\necho here $RANK\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for cmd, env in (([str(program)], None), (["gw-here-7f3a"], {"PATH": ""})):
        lines: list[str] = []
        res = launch(loopback_cluster(2), cmd, timeout=60, sink=lines.append, extra_env=env)
        assert res.returncode == 0, (cmd, lines)
    assert sorted(lines) == ["[rank 0] here 0", "[rank 1] here 1"], lines
