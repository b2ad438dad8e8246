"""Models, profiles and data: built-in profiles read as UTF-8 whatever the locale, seeds and
budgets refused in one line, and a profile's format that is the integer 1, not JSON's true."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gradwire.profiles
from gradwire import profiles
from gradwire.data import stdlib_source
from gradwire.errors import GradwireError
from gradwire.models import build_model

# A locale whose preferred encoding is ASCII: UTF-8 mode and locale coercion both off.
ASCII_LOCALE = {"PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "LC_ALL": "C", "LANG": "C"}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **ASCII_LOCALE})


def test_builtin_profiles_load_under_an_ascii_locale() -> None:
    """resnet20's description holds "§": read in the locale's encoding, every built-in
    profile (and `gradwire profile`'s listing of them) was a UnicodeDecodeError traceback."""
    r = _python("from gradwire import profiles\n"
                "print(ascii([profiles.load(n).description for n in profiles.builtin_names()]))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "He et al. 2016 \\xa74.2" in r.stdout


def test_architectures_rewrites_the_profile_files_byte_for_byte_under_an_ascii_locale(
        tmp_path: Path) -> None:
    builtin = Path(gradwire.profiles.__file__).parent / "builtin"
    for f in builtin.glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    r = _python(f"from pathlib import Path\nfrom gradwire.profiles import architectures\n"
                f"architectures.main(Path({str(tmp_path)!r}))")
    assert r.returncode == 0, r.stderr[-2000:]
    for f in builtin.glob("*.json"):
        assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("seed", [2**64, 2**70, -1, 1.5, "3", None, True])
def test_build_model_refuses_a_seed_in_one_line(seed: object) -> None:
    """2**70 was a ValueError, 1.5 or "3" a RuntimeError from torch; -1 built the model of
    seed 2**64 - 1 (torch's generator wraps negative seeds)."""
    with pytest.raises(GradwireError) as e:
        build_model("mlp-small", seed=seed)
    assert "seed" in str(e.value) and "\n" not in str(e.value)
    assert build_model("mlp-small", seed=2**64 - 1) is not None  # the largest torch takes


@pytest.mark.parametrize("budget", [-5, 1.5, True])
def test_stdlib_source_refuses_a_budget_that_is_no_count_of_bytes(budget: object) -> None:
    """-5 returned the first file less its last 5 bytes (5,213 bytes for a budget of -5);
    1.5 was a TypeError from slicing."""
    with pytest.raises(GradwireError, match="budget must be an integer >= 0"):
        stdlib_source(budget)  # type: ignore[arg-type]
    assert stdlib_source(0) == b""


@pytest.mark.parametrize("fmt", [True, 1.0])
def test_profile_format_must_be_the_integer_1(fmt: object) -> None:
    doc = {"format": fmt, "model": "toy", "forward_s": 0.01, "backward_s": 0.02,
           "params": [["b", 10], ["w", 100]]}
    with pytest.raises(GradwireError, match="field 'format' must be 1"):
        profiles.parse(json.dumps(doc), "toy.json")
    assert profiles.parse(json.dumps(doc | {"format": 1}), "toy.json").numel == 110
