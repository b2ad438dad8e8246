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
    join_world("gloo", 1.5, join=60)
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


STORE = textwrap.dedent("""
    import time
    import torch.distributed as dist
    from gradwire.rendezvous import join_world
    join_world("gloo", 1.5, join=60)
    t0 = time.monotonic()
    try:
        dist.distributed_c10d._get_default_store().get("a key no rank sets")
    except Exception:
        print(f"TIMED OUT {time.monotonic() - t0:.1f}")
""")


def test_the_joined_store_keeps_the_short_timeout_too():
    """A store operation after joining (a second process group's set-up) waits the collective
    limit, not the join's."""
    env = {**_env(0, free_port()), "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", STORE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.startswith("TIMED OUT"), done.stdout + done.stderr
    assert float(done.stdout.split()[2]) < 6, done.stdout  # 1.5 s, not the 60 s of the join


SLOW_DATA = textwrap.dedent("""
    import os, sys, time
    from gradwire.train import worker
    load = worker.load_task

    def slow(*args, **kwargs):
        if os.environ["RANK"] == "1":
            time.sleep(5)  # a rank slowed by a busy machine, longer than GRADWIRE_TIMEOUT
        return load(*args, **kwargs)

    worker.load_task = slow
    sys.exit(worker.main(sys.argv[1:]))
""")


def test_a_rank_slow_to_load_its_data_does_not_fail_a_short_gradwire_timeout(tmp_path):
    """The data and model are made before the join, within its limit: after it, DDP's set-up
    waited for them within GRADWIRE_TIMEOUT."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", SLOW_DATA, *WORKER[3:],
                               *(["--out", str(tmp_path / "r.json")] if r == 0 else [])],
                              env=_env(r, port, GRADWIRE_TIMEOUT="2"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out + err
    assert (tmp_path / "r.json").exists()
