"""env:// variables that are set but cannot place a rank in a run are refused in one line,
naming the variable, before the rendezvous: a RANK outside the world, or in other scripts'
digits, had waited out the whole rendezvous timeout for a store that no rank serves, and a
RANK of "abc" had ended in int()'s message, which names no variable."""

import os
import subprocess
import sys

import pytest
from test_rendezvous_one_line import OUT, PROGRAMS

from gradwire.errors import GradwireError
from gradwire.launcher import free_port
from gradwire.rendezvous import check_env

GOOD = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("name,raw,why", [
    ("RANK", "2", "RANK must be a whole number from 0 to 1 (this rank's number"),
    ("RANK", "-1", "RANK must be a whole number from 0 to 1"),
    ("RANK", "١", "RANK must be a whole number from 0 to 1"),
    ("RANK", "abc", "RANK must be a whole number from 0 to 1"),
    ("WORLD_SIZE", "0", "WORLD_SIZE must be a whole number >= 1 (the number of ranks"),
    ("WORLD_SIZE", "2.0", "WORLD_SIZE must be a whole number >= 1"),
    ("MASTER_PORT", "99999", "MASTER_PORT must be a whole number from 0 to 65535"),
    ("MASTER_PORT", "http", "MASTER_PORT must be a whole number from 0 to 65535"),
])
def test_a_variable_that_cannot_place_the_rank_is_named(name, raw, why):
    with pytest.raises(GradwireError) as e:
        check_env({**GOOD, name: raw})
    assert str(e.value).startswith(why) and str(e.value).endswith(f"got {raw!r}"), e.value
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("env", [
    GOOD, {**GOOD, "RANK": "0"}, {**GOOD, "RANK": " 1 "}, {**GOOD, "MASTER_PORT": "65535"},
    {"MASTER_ADDR": "127.0.0.1"},  # unset ones are c10d's to name, with their own advice
])
def test_what_can_place_a_rank_passes(env):
    check_env(env)


def test_every_rank_program_refuses_a_rank_outside_the_world_at_once(tmp_path):
    """RANK 2 of 2: each program says so in one line, where c10d had waited for rank 0's
    store for its whole timeout (120 to 600 s)."""
    env = {**os.environ, **GOOD, "RANK": "2", "MASTER_PORT": str(free_port()),
           "TORCHELASTIC_USE_AGENT_STORE": "False"}
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", *[str(tmp_path / name) if a == OUT else a for a in argv]],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, argv in PROGRAMS.items()}
    for name, p in procs.items():
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail(f"{name} still waiting after 60 s")
        text = (out + err).strip()
        assert p.returncode != 0 and len(text.splitlines()) == 1, (name, text)
        assert "error: RANK must be a whole number from 0 to 1" in text, (name, text)
