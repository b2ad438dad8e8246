"""The worker's ranks get --join-timeout (60 s) to join however short the collective timeout
is: a short GRADWIRE_TIMEOUT, set to find a stalled rank quickly, had also failed ranks that
started a few seconds apart. Once joined, the group's collectives keep the short limit."""

import os
import subprocess
import sys
import textwrap
import time

from gradwire.launcher import free_port

WORKER = [sys.executable, "-m", "gradwire.train.worker", "--model", "mlp-small", "--epochs",
          "1", "--batch-size", "256", "--no-warmup"]


def _env(rank: int, port: int, **extra: str) -> dict[str, str]:
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False", **extra}


def test_a_rank_that_starts_later_than_gradwire_timeout_still_joins(tmp_path):
    port = free_port()
    first = subprocess.Popen(WORKER + ["--out", str(tmp_path / "r.json")],
                             env=_env(0, port, GRADWIRE_TIMEOUT="2"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(5)  # later than GRADWIRE_TIMEOUT, well within --join-timeout
    late = subprocess.Popen(WORKER, env=_env(1, port, GRADWIRE_TIMEOUT="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for p in (first, late):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out + err
    assert (tmp_path / "r.json").exists()


LOWERED = textwrap.dedent("""
    import sys, time
    import torch.distributed as dist
    from gradwire.rendezvous import join_world
    join_world("gloo", 1.5, join_at_least=60)
    if dist.get_rank() == 1:
        time.sleep(8)  # a stall past the collective timeout
        sys.exit(0)
    t0 = time.monotonic()
    try:
        dist.barrier()
    except Exception:
        print(f"TIMED OUT {time.monotonic() - t0:.1f}")
""")


def test_the_joined_group_keeps_the_short_timeout():
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", LOWERED], env=_env(r, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=120)
    assert out.startswith("TIMED OUT"), out + err
    assert float(out.split()[2]) < 6, out  # 1.5 s, not the 60 s of the join
