"""Edges of the small shared modules: link rates that parse a little off, integers
too large for a float in a user's file, and files replaced whole that lost their mode or, behind
a link, were written in place."""

import errno
import json
import os
import stat
import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gradwire.bandwidth import format_bandwidth, parse_bandwidth
from gradwire.check import check_fraction, check_real, is_real
from gradwire.errors import GradwireError
from gradwire.jsonfile import replace_text


@pytest.mark.parametrize("a,b", [("0.534gbit", "534mbit"), ("0.067gbit", "67mbit")])
def test_one_rate_in_two_units_is_one_rate(a, b):
    """The number was multiplied by its unit's scale after it was read, off by an ulp: a
    cluster made with 534mbit refused --bandwidth 0.534gbit as a rate that "does not match"."""
    assert parse_bandwidth(a) == parse_bandwidth(b)


EXPONENT = {"kbit": 3, "mbit": 6, "gbit": 9}


@given(st.integers(1, 999_999), st.integers(0, 6), st.sampled_from(["kbit", "mbit", "gbit"]))
def test_a_rate_as_typed_is_the_nearest_float_and_prints_back_as_itself(digits, places, unit):
    """Every rate of up to 6 significant digits (what the tables print) is the float nearest
    its value in bits per second, and reads back the same from what it prints as: 0.534gbit
    was 534000000.00000006, printed as 534mbit, which read back as another rate."""
    number = f"{digits // 10**places}.{digits % 10**places:0{places}d}" if places else str(digits)
    exact = float(f"{number}e{EXPONENT[unit]}")  # the decimal value, rounded once
    assume(1e5 <= exact <= 4e11)
    assert parse_bandwidth(number + unit) == exact
    assert parse_bandwidth(format_bandwidth(exact)) == exact


def test_an_integer_too_large_for_a_float_is_refused_not_a_traceback():
    """JSON reads 1 followed by 400 zeros as an int; math.isfinite() of it raised
    OverflowError out of every range check of a profile, calibration or trace."""
    from gradwire.profiles import parse

    assert not is_real(10**400) and not is_real(-(10**400), high=0)
    with pytest.raises(GradwireError, match="must be a finite number >= 0"):
        check_real("x", 10**400)
    with pytest.raises(GradwireError, match=r"--density must be in \(0, 1\], got 1000"):
        check_fraction("--density", 10**400)
    doc = {"format": 1, "model": "m", "forward_s": 0.01, "backward_s": 0.02,
           "params": [["w", 1000]]}
    text = json.dumps(doc).replace("0.02", "1" + "0" * 400)
    with pytest.raises(GradwireError, match="p.json"):
        parse(text, "p.json")


def test_a_replaced_file_keeps_its_mode(tmp_path):
    """The new file took the umask's mode: a calibration kept 0600 became readable by all,
    a group-writable result lost its group's write."""
    for mode in (0o600, 0o664):
        path = tmp_path / f"r{mode:o}.json"
        path.write_text("old")
        path.chmod(mode)
        replace_text(path, "new")
        assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == mode
    replace_text(tmp_path / "fresh.json", "x")  # a new file: the umask's mode, as before
    assert stat.S_IMODE((tmp_path / "fresh.json").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_file_behind_a_link_is_replaced_whole_and_the_link_kept(monkeypatch, tmp_path):
    """A link was written through in place: a write that failed half way (a full disk) left
    the file it points to cut short, where a plain file keeps what it held."""
    from gradwire import jsonfile

    real = tmp_path / "results" / "r.json"
    real.parent.mkdir()
    real.write_text("the earlier result\n")
    link = tmp_path / "latest.json"
    link.symlink_to(real)

    class Full:
        """A file on a disk that fills after the first 3 bytes."""

        def __init__(self, *args, **kwargs):
            self.f = open(*args, **kwargs)  # noqa: SIM115

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:3])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(jsonfile, "open", Full, raising=False)
        with pytest.raises(OSError, match="No space left"):
            replace_text(link, "a new result\n")
    assert real.read_text() == "the earlier result\n"
    assert sorted(p.name for p in real.parent.iterdir()) == ["r.json"]
    replace_text(link, "new\n")
    assert link.is_symlink() and link.resolve() == real and real.read_text() == "new\n"


def test_files_are_utf_8_whatever_the_locale(tmp_path):
    """Files were read and written in the locale's encoding: under an ASCII locale a UTF-8
    profile naming its model "résumé" was "not a text file", and a result holding "ρ" was a
    UnicodeEncodeError traceback (no OSError, so no result saved elsewhere either)."""
    given, out = tmp_path / "p.json", tmp_path / "r.txt"
    given.write_bytes('{"model": "résumé"}'.encode())
    script = ("import sys\n"
              "from gradwire.jsonfile import read_object, replace_text\n"
              "assert sys.flags.utf8_mode == 0\n"
              "assert read_object(sys.argv[1], 'p.json') == {'model': 'r\\xe9sum\\xe9'}\n"
              "replace_text(sys.argv[2], '\\u03c1=0.01')\n"
              # a result saved elsewhere, its path having failed late
              "import os, pathlib\n"
              "from gradwire.jsonfile import save_elsewhere\n"
              "os.chdir(pathlib.Path(sys.argv[2]).parent)\n"
              "print(save_elsewhere(pathlib.Path('x.txt'), '\\u03c1'))\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run([sys.executable, "-c", script, str(given), str(out)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-300:]
    assert out.read_bytes() == "ρ=0.01".encode()
    saved, = tmp_path.glob("gradwire-x-*.txt")
    assert saved.read_bytes() == "ρ".encode() and str(saved) in done.stdout


def test_a_trace_and_a_timeline_are_replaced_whole_through_a_link(tmp_path):
    """trace.save and simulate's --timeline wrote with Path.write_text: in place (half a file
    on a full disk) and took the umask's mode; they go through replace_text now."""
    from gradwire.sim import report
    from gradwire.sim import trace as tr

    store = tmp_path / "store"
    store.mkdir()
    trace = tr.synthetic("s", [1000, 2000], 0.05, 0.1, 0.01)
    for name, write in (("t.jsonl", lambda p: tr.save(trace, p)),
                        ("tl.json", lambda p: report.write_timeline([], 2, p))):
        real, link = store / name, tmp_path / name
        real.write_text("old")
        real.chmod(0o600)
        link.symlink_to(real)
        before = real.stat().st_ino
        write(link)
        assert link.is_symlink() and real.read_text() != "old"
        assert real.stat().st_ino != before  # a new file renamed over the old, not rewritten
        assert stat.S_IMODE(real.stat().st_mode) == 0o600  # replaced whole: mode kept


def test_a_replaced_file_is_on_the_disk_before_its_name_moves(monkeypatch, tmp_path):
    """Renamed before its data was synced, a crash could leave an empty file in place of the
    whole one that was there."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"),
                                                     real_replace(a, b))[1])
    target = tmp_path / "f.json"
    replace_text(target, "{}")
    assert events == ["fsync", "replace"] and target.read_text() == "{}"
