"""The wheel ships the whole package: every file under src/gradwire, data files included, and
the package reads its built-in tables from an installed wheel, with no source tree in reach."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "gradwire"
_JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def _pip(*args: str, cwd: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", "-q", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout (setuptools builds in ./build and ships what
    a stale one holds, so never in the checkout itself); offline, with this venv's setuptools."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=_JUNK)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"),
         str(tree), cwd=tmp)
    (built,) = (tmp / "dist").glob("gradwire-*.whl")
    return built


def _package_files() -> set[str]:
    return {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def test_the_wheel_holds_every_file_of_the_package(wheel):
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("gradwire/")}
    source = _package_files()
    missing, extra = sorted(source - shipped), sorted(shipped - source)
    assert not missing, (f"not in the wheel: {missing}; add their pattern to "
                         "[tool.setuptools.package-data] in pyproject.toml")
    assert not extra, f"in the wheel but not under src/gradwire: {extra}"
    assert any(n.endswith(".json") for n in source)  # the data files are there to check


def test_the_wheel_has_the_version_gradwire_prints(wheel):
    """One version, gradwire.__version__: the wheel's name and metadata carry it."""
    import gradwire

    assert wheel.name.startswith(f"gradwire-{gradwire.__version__}-"), wheel.name
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("dist-info/METADATA"))
    assert f"\nVersion: {gradwire.__version__}\n" in zipfile.ZipFile(wheel).read(meta).decode()


_LOADS = """
import gradwire
from gradwire import profiles
from gradwire.perf import codecs
names = profiles.builtin_names()
for name in names:
    profiles.load(name)
for name in codecs.BUILTIN:
    codecs.load(name)
print(gradwire.__file__, len(names))
"""


def test_an_installed_wheel_reads_every_built_in_table(wheel, tmp_path):
    site = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "--target", str(site), str(wheel), cwd=tmp_path)
    # The target folder ahead of this venv's editable install; run outside the checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run([sys.executable, "-c", _LOADS], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    where, profiles = p.stdout.split()
    assert Path(where).is_relative_to(site), where
    # the profiles are listed from the installed folder: all of them, as in the source
    assert int(profiles) == sum(f.startswith("gradwire/profiles/builtin/")
                                for f in _package_files())
