"""A rank whose standard error is closed, or is a pipe whose reader has gone, still joins: what
c10d wrote during a rendezvous that succeeded is shown afterwards, and showing it there had
raised OSError (EBADF, EPIPE) out of join_world, ending a rank that had joined. Without the
hold, c10d's own writes fail there without a word and the rank goes on."""

import os
import subprocess
import sys

from gradwire.launcher import free_port

# A world of one that joins once its parent says so (the parent first takes its standard error
# away), then reports on standard output. TORCH_CPP_LOG_LEVEL=INFO makes c10d write a line on
# success ("The client socket has connected ..."), which the hold then shows.
JOIN = """
import os, sys, traceback
import torch.distributed as dist
from gradwire.rendezvous import join_world
if sys.argv[1] == "closed":
    os.close(2)
sys.stdin.readline()
try:
    join_world("gloo", 30)
except BaseException:
    os.write(1, traceback.format_exc().encode())
    raise
os.write(1, b"joined\\n")
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "TORCH_CPP_LOG_LEVEL": "INFO"}


def _join(how: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOIN, how], env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_rank_with_its_standard_error_closed_joins():
    p = _join("closed")
    out, _ = p.communicate("go\n", timeout=60)
    assert (p.returncode, out) == (0, "joined\n"), out


def test_a_rank_whose_standard_error_reader_went_away_joins():
    p = _join("pipe")
    p.stderr.close()  # before the rank joins: it waits for the line on its standard input
    p.stderr = None
    out, _ = p.communicate("go\n", timeout=60)
    assert (p.returncode, out) == (0, "joined\n"), out
