"""What a user is told about their inputs and outputs: the link rates each context takes, the
calibration table's digits, a bench whose rows came out wrong and whose --json could not be
written, a file that is text but not UTF-8, and an output path that is a link (to no file, or to
a file in a folder of its own)."""

import errno
import io
import json
import os
from pathlib import Path
from unittest import mock

import calibration_doc
import pytest
from conftest import cli_error, one_line_cli_error, one_line_raised, run_cli, start_here
from hypothesis import given
from hypothesis import strategies as st

from gradwire.bandwidth import parse_bandwidth
from gradwire.errors import GradwireError
from gradwire.jsonfile import check_writable, read_text, replace_text

UNSHAPED_WORDS = ("none", "unlimited")


# ---- parse_bandwidth: an invalid rate's error lists what the context takes, and only that

@given(text=st.text(max_size=12), unshaped=st.booleans())
def test_an_invalid_rate_lists_every_form_its_context_takes(text, unshaped):
    """"unlimited" is taken where an unshaped link is, but the error for "unlimitted" listed
    only "none": the user was not told the word they meant. Where no unshaped link is taken
    (a model needs a rate), neither word is offered."""
    try:
        parse_bandwidth(text, unshaped=unshaped)
        return
    except GradwireError as e:
        message = str(e)
    if "is not valid" not in message:  # a rate out of range: its range is what is said
        return
    expected = message.split(": expected ", 1)[1]
    for word in UNSHAPED_WORDS:
        taken = unshaped and parse_bandwidth(word, unshaped=True) is None
        assert (word in expected) == taken, (word, unshaped, expected)


def test_the_cli_names_unlimited_beside_none(monkeypatch, capsys):
    start_here(monkeypatch, "gradwire.cli.bench", "cluster_for")
    code, err = cli_error(monkeypatch, capsys, "bench", "--loopback", "--bandwidth",
                          "unlimitted")
    one_line_cli_error(code, err, "bandwidth 'unlimitted' is not valid", "none", "unlimited")


@pytest.mark.parametrize("command", [["cluster", "up"], ["bench"], ["train"], ["demo"]])
def test_the_help_names_every_word_for_an_unshaped_link(monkeypatch, capsys, command):
    """--bandwidth's help named "none" only, though "unlimited" is taken too."""
    code, out, _ = run_cli(monkeypatch, capsys, [*command, "--help"])
    assert code == 0
    text = " ".join(out.split())
    assert "--bandwidth" in text
    for word in UNSHAPED_WORDS:
        assert word in text.split("--bandwidth", 1)[1], (command, word)


# ---- the calibration table: rates to three significant digits

def _calibration_row(beta: float, gamma: float) -> dict[str, str]:
    """The cells of the calibration table's row, by column, as `gradwire calibrate` prints
    a calibration of ``beta`` and ``gamma`` (s/B)."""
    from rich.console import Console
    from rich.table import Table

    from gradwire.cli import bench
    from gradwire.perf import calibration

    printed = []
    console = Console(file=io.StringIO(), width=300, markup=False)
    console.print = lambda x, *a, **k: printed.append(x)
    c = calibration.parse(calibration_doc.doc(beta_s_per_byte=beta, gamma_s_per_byte=gamma),
                          "test")
    with mock.patch.object(bench, "console", console):
        bench._show_calibration(c, Path("cal.json"))
    first = next(t for t in printed if isinstance(t, Table))
    # a header's unit is on its second line
    return {" ".join(str(col.header).split()): list(col.cells)[0] for col in first.columns}


@given(bps=st.floats(1e5, 1e14), gamma_ns=st.floats(1e-5, 1e3))
def test_calibration_rates_keep_three_significant_digits(bps, gamma_ns):
    """Three decimals printed a 100kbit link as 0.000 Gbit/s (and a GPU's γ of 1e-5 ns/B as
    0.0000): every printed β, link rate and γ reads back within half a unit of its third
    significant digit."""
    beta = 8 / bps
    row = _calibration_row(beta, gamma_ns * 1e-9)
    for column, value in (("β (ns/byte)", beta * 1e9), ("link (Gbit/s)", bps / 1e9),
                          ("γ (ns/byte)", gamma_ns)):
        assert float(row[column]) == pytest.approx(value, rel=5e-3), (column, row[column])


# ---- bench: wrong rows are said even when --json cannot be written

def test_bench_says_its_wrong_rows_when_its_json_cannot_be_written(tmp_path, monkeypatch,
                                                                   capsys):
    """A disk that filled during the run: the --json error ("could not write ...; result saved
    to ...") was the only line, and the rows that came out wrong, the run's own failure, went
    unsaid. Both are said, the wrong rows first."""
    import gradwire.cli.options
    from gradwire.bench import run as bench_run

    def fake_ranks(cluster, module, args, what, timeout, console, total, tick, ticked):
        row = {"collective": "allreduce", "name": "ring", "params": {}, "count": 256,
               "bytes": 1024, "type": "float32", "time_s": 1e-3, "wrong": 0, "header": True}
        return [{**row, "algo": "builtin", "name": "builtin", "header": False},
                {**row, "algo": "ring", "wrong": 7}]

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bench_run, "run_ranks", fake_ranks)
    monkeypatch.setattr(gradwire.cli.options, "replace_text", full)
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, err = cli_error(monkeypatch, capsys, "bench", "--loopback", "--hosts", "2",
                          "--sizes", "1K", "--algo", "ring", "--json", "b.json")
    one_line_cli_error(code, err, "1 of 2 rows gave a wrong result: ring at 1K (7 elements)",
                       "could not write b.json (No space left on device); result saved to ")
    assert err.index("wrong result") < err.index("could not write"), err
    (kept,) = tmp_path.glob("gradwire-b-*.json")
    assert [r["wrong"] for r in json.loads(kept.read_text())["rows"]] == [0, 7]


# ---- read_text: text in another encoding is named as such, at its first byte

ASCII_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e) | st.sampled_from(
    "\n\r"), max_size=40)


@given(before=ASCII_TEXT, char=st.characters(min_codepoint=0x80, max_codepoint=0xff),
       after=ASCII_TEXT)
def test_a_latin_1_file_is_named_not_utf_8_at_its_first_such_byte(tmp_path_factory, before,
                                                                   char, after):
    """A profile saved in Latin-1 ("café" with é as the one byte 0xe9) was "not a text file":
    it is text, but not UTF-8, and the error says so, with the byte, its offset and its line
    (line ends counted as the file is read: "\\r\\n" and "\\r" each end one)."""
    path = tmp_path_factory.mktemp("latin1") / "p.json"
    path.write_bytes((before + char + after).encode("latin-1"))
    line = before.replace("\r\n", "\n").replace("\r", "\n").count("\n") + 1
    one_line_raised(lambda: read_text(path, "p.json"),
                    f"p.json: not UTF-8 text (byte 0x{ord(char):02x} at offset {len(before)}, "
                    f"line {line})", "save it as UTF-8")


def test_a_latin_1_profile_is_one_line_on_the_command_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "mine.json"
    path.write_bytes(b'{"model": "caf\xe9"}')
    code, err = cli_error(monkeypatch, capsys, "advise", "--model", str(path))
    one_line_cli_error(code, err, "not UTF-8 text (byte 0xe9 at offset 14, line 1)")


# ---- check_writable: an output path that is a link to no file

def test_a_link_to_no_file_is_taken_only_where_a_write_gets_through_it(tmp_path):
    """A link to a missing file in an existing folder is written through, as open(..., "w")
    does; a link into a folder that does not exist was taken, and the write failed after the
    run's work: it is refused before, naming the link, its target and the missing folder."""
    ok = tmp_path / "ok.json"
    ok.symlink_to(tmp_path / "target.json")
    assert check_writable(ok, "--json") == ok
    replace_text(ok, "{}\n")
    assert ok.is_symlink() and (tmp_path / "target.json").read_text() == "{}\n"

    bad = tmp_path / "bad.json"
    missing = tmp_path / "missing" / "dir"
    bad.symlink_to(missing / "f.json")
    one_line_raised(lambda: check_writable(bad, "--json"), f"--json {str(bad)!r}",
                    f"a link to {str(missing / 'f.json')!r}",
                    f"folder {str(missing)!r} does not exist")


@pytest.mark.parametrize("loop", [("a", "b"), ("self",)])
def test_a_loop_of_links_is_refused_before_the_work(tmp_path, monkeypatch, capsys, loop):
    """A link to itself, or two links to each other: no write gets through them, and the
    error came only at the end of the run (after the work, "Too many levels of symbolic
    links" with the result saved elsewhere)."""
    for name, to in zip(loop, loop[1:] + loop[:1], strict=True):
        (tmp_path / name).symlink_to(tmp_path / to)
    path = tmp_path / loop[0]
    start_here(monkeypatch, "gradwire.bench.run", "run_bench")
    code, err = cli_error(monkeypatch, capsys, "bench", "--loopback", "--hosts", "2",
                          "--sizes", "1K", "--json", str(path))
    one_line_cli_error(code, err, f"--json {str(path)!r} is a loop of links")


def test_a_link_to_a_file_is_taken_where_its_own_folder_may_not_be_written(tmp_path,
                                                                           monkeypatch):
    """The write goes beside the file the link names (or through the link), never into the
    link's folder, yet a link in a folder this process may not write into was refused."""
    links, files = tmp_path / "links", tmp_path / "files"
    links.mkdir()
    files.mkdir()
    (files / "r.json").write_text("old\n")
    link = links / "r.json"
    link.symlink_to(files / "r.json")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != links
                        and real_access(p, mode, **kw))  # root may write anywhere: deny here
    assert check_writable(link, "--json") == link
    replace_text(link, "new\n")
    assert link.is_symlink() and (files / "r.json").read_text() == "new\n"
    plain = links / "plain.json"  # a file of its own there is still refused: it goes beside
    plain.write_text("x")
    one_line_raised(lambda: check_writable(plain, "--json"), "may not be written")
