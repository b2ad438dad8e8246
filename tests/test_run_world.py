"""tests/conftest.py's run_world forks its ranks from a server that an earlier test may have
started: they must still have the environment and working folder of the test that calls it."""
import os
from pathlib import Path

from conftest import run_world


def _where(rank: int, world: int) -> dict:
    return {"probe": os.environ.get("GW_RUN_WORLD_PROBE"), "cwd": os.getcwd()}


def test_ranks_have_the_calling_tests_environment_and_folder(tmp_path, monkeypatch):
    for name in ("a", "b"):  # the second world forks from the server the first one started
        here = tmp_path / name
        here.mkdir()
        monkeypatch.setenv("GW_RUN_WORLD_PROBE", name)
        monkeypatch.chdir(here)
        assert run_world(_where, 2, here) == [{"probe": name, "cwd": str(Path.cwd())}] * 2
