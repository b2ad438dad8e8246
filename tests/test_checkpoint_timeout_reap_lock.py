"""A checkpoint save that takes longer than the collective timeout, and ranks that go during
one; stale clusters judged and taken over under the clusters' lock, torn down outside it."""

import datetime
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from gradwire.cluster import netns
from gradwire.cluster.state import Cluster, Host, process_start_ticks, save_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import free_port, peer_lost

# ---------------------------------------------------------------- checkpoint save vs timeout

COLLECTIVE_S = 1.0  # the process group's timeout in these worlds: a save takes longer


class _Agg:
    """A rank's aggregation state: one residual as large as the model."""

    def state_dict(self) -> dict:
        return {"residual": torch.ones(64 * 64)}


def _setup() -> tuple:
    """(model, optimizer, aggregation) of a small run after a step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 64)).sum().backward()
    opt.step()  # momentum buffers, as a checkpoint after an epoch holds
    return model, opt, _Agg()


def _counted(world: int, model, opt, agg) -> int:
    """The bytes a waiting rank allows time for: the model, the optimizer, and as many
    aggregation states as ranks."""
    from gradwire.train import worker

    return (worker.tensor_bytes([model.state_dict(), opt.state_dict()])
            + world * worker.tensor_bytes(agg.state_dict()))


def _save(ck: str, extra_s: float, write, rank: int, world: int) -> dict:
    """One save_checkpoint, rank 0's write done by ``write(real_save, path, state)`` and the
    others allowing ``extra_s`` for it beyond the collective timeout; what it did on this
    rank ('ok' or the error) and its seconds."""
    from gradwire.train import checkpoint, worker

    real = checkpoint.save
    checkpoint.save = lambda path, state: write(real, path, state)  # a spawned rank's own
    model, opt, agg = _setup()
    worker.SAVE_RATE_FLOOR = _counted(world, model, opt, agg) / extra_s
    _all_here()
    t0 = time.monotonic()
    try:
        worker.save_checkpoint(ck, model, opt, agg, {}, 1, {}, timeout=COLLECTIVE_S)
        what = "ok"
    except BaseException as e:  # noqa: BLE001 - SystemExit and gloo's RuntimeError alike
        what = f"{type(e).__name__}: {e}"
    finally:
        checkpoint.save = real
    return {"did": what, "s": time.monotonic() - t0}


def slow_then_stalled(rank: int, world: int, out: str) -> dict:
    """A save whose write takes twice the collective timeout (within the bound), then one
    whose rank 0 stalls until every other rank has given up on it."""
    def slow(real, path, state):
        time.sleep(2 * COLLECTIVE_S)
        real(path, state)

    first = _save(str(Path(out, "ck.pt")), 2.5, slow, rank, world)

    def stalled(real, path, state):
        end = time.monotonic() + 30
        while not Path(out, "rank1.json").exists() and time.monotonic() < end:
            time.sleep(0.05)

    second = _save(str(Path(out, "ck2.pt")), 1.5, stalled, rank, world)
    return {"slow": first, "stalled": second}


def rank0_dies(rank: int, world: int, out: str) -> dict:
    """A save whose rank 0 exits half way through the write."""
    def dies(real, path, state):
        os._exit(9)

    return {"dies": _save(str(Path(out, "ck.pt")), 30.0, dies, rank, world)}


def _all_here() -> None:
    """Wait for every rank (30 s at most), then let collectives wait COLLECTIVE_S: a rank that
    comes to the save late, its first step of a model having taken seconds (it imports
    torch._dynamo) on a loaded machine, is no stalled rank."""
    import torch.distributed as dist

    dist.group.WORLD.set_timeout(datetime.timedelta(seconds=30))
    dist.barrier()
    dist.group.WORLD.set_timeout(datetime.timedelta(seconds=COLLECTIVE_S))


def _rank(rank: int, world: int, port: int, scenario, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))
    seen = scenario(rank, world, out)
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    os._exit(0)  # not a gloo teardown under a peer that has gone


def _world(scenario, world: int, out: Path) -> dict[int, dict]:
    """What ``scenario(rank, world, out)`` returned on each spawned gloo rank that got to
    return; every rank is ended before this returns."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, scenario, str(out)))
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(90)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return {r: json.loads((out / f"rank{r}.json").read_text())
            for r in range(world) if (out / f"rank{r}.json").exists()}


def test_a_save_longer_than_the_collective_timeout_passes_and_a_stalled_rank_0_is_named(
        tmp_path):
    """Rank 0 writes for twice the collective timeout: the other rank waits for it (it
    allows the timeout plus 1 s per MiB at SAVE_RATE_FLOOR), where it failed at the timeout
    with gloo's traceback. Rank 0 stalled beyond that bound: the other rank gives up within
    it, in one line naming rank 0 as the launcher reads it, and rank 0 then finds it gone."""
    seen = _world(slow_then_stalled, 2, tmp_path)
    assert seen[0]["slow"]["did"] == seen[1]["slow"]["did"] == "ok", seen
    assert seen[1]["slow"]["s"] > 1.5 * COLLECTIVE_S, seen
    assert (tmp_path / "ck.pt").stat().st_size > 0
    waited = seen[1]["stalled"]
    bound = COLLECTIVE_S + 1.5
    assert waited["did"].startswith("PeerError: rank 1 in the checkpoint save: receive of 4 "
                                    f"bytes from rank 0 timed out after {bound:.1f} s: rank 0 "
                                    "stalled writing checkpoint"), waited
    assert "\n" not in waited["did"] and bound - 0.2 < waited["s"] < bound + 3, waited
    assert peer_lost(waited["did"]) == (1, 0)
    gone = seen[0]["stalled"]["did"]
    assert gone == ("PeerError: rank 0 in the checkpoint save: send of 4 bytes to rank 1 "
                    "failed: the connection closed (rank 1 exited or was killed)"), gone


def test_a_rank_0_that_dies_during_the_save_is_named_at_once(tmp_path):
    """The other rank allows the write 30 s more than the timeout, but a rank 0 that exits
    closes its connections: it stops at once, in one line naming rank 0."""
    seen = _world(rank0_dies, 2, tmp_path)
    assert list(seen) == [1], seen
    did = seen[1]["dies"]
    assert did["did"] == ("PeerError: rank 1 in the checkpoint save: receive of 4 bytes from "
                          "rank 0 failed: the connection closed (rank 0 exited or was killed)"), did
    assert did["s"] < 10, did


def test_the_wait_allows_for_the_bytes_a_checkpoint_holds(one_rank, tmp_path):
    """What a waiting rank counts (the model, the optimizer, each rank's aggregation state)
    is what rank 0 writes, less the file's own few kilobytes."""
    from gradwire.train import worker

    model, opt, agg = _setup()
    ck = tmp_path / "ck.pt"
    worker.save_checkpoint(str(ck), model, opt, agg, {}, 1, {}, timeout=COLLECTIVE_S)
    counted = _counted(1, model, opt, agg)
    assert ck.stat().st_size - 16384 < counted <= ck.stat().st_size
    assert worker.save_wait(60.0, counted) == 60.0 + counted / worker.SAVE_RATE_FLOOR


# ---------------------------------------------------------------- stale clusters, one reaper

STALE = "gw0c1a01"


def _stale(state_dir: Path, monkeypatch) -> None:
    """A stale cluster: its owner is no live process (this pid, another start time)."""
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(state_dir))
    save_cluster(Cluster(STALE, 1e9, [Host(0, f"{STALE}-h0", "10.213.9.1", "eth0")], subnet=9,
                         owner=[os.getpid(), 1]))
    # no `ip` here: a claim finds no namespaces or links of any name
    monkeypatch.setattr(netns, "_run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "",
                                                                                     ""))
    monkeypatch.setattr(netns, "_orphans", lambda out: set())


def _lock_is_free(lock: Path) -> bool:
    """Whether another open of the lock file ``lock`` can take it now."""
    import fcntl

    with open(lock, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


class _Run(threading.Thread):
    """``fn()`` on a thread of its own; ``result``: what it returned or raised."""

    def __init__(self, name: str, fn) -> None:
        super().__init__(name=name, daemon=True)
        self.fn, self.result = fn, None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except GradwireError as e:
            self.result = e


def test_two_runs_reap_a_stale_cluster_once_and_not_under_the_lock(tmp_path, monkeypatch):
    """Two runs start as one is tearing a stale cluster down: the second finds it taken
    over (it tore it down a second time, which could remove a new cluster of that name), and
    the teardown runs with the clusters' lock free, so claims need not wait for it."""
    _stale(tmp_path, monkeypatch)
    torn, free = [], []
    tearing, finish = threading.Event(), threading.Event()

    def teardown(name: str) -> None:
        torn.append(name)
        free.append(_lock_is_free(tmp_path / "clusters.lock"))
        if len(torn) == 1:
            tearing.set()
            finish.wait(10)
        (tmp_path / f"{name}.json").unlink(missing_ok=True)

    monkeypatch.setattr(netns, "_teardown", teardown)
    first = _Run("first", netns.reap_stale)
    first.start()
    try:
        assert tearing.wait(10)
        assert netns.reap_stale() == []
    finally:
        finish.set()
        first.join(10)
    assert first.result == [STALE] and torn == [STALE] and free == [True]
    assert not (tmp_path / f"{STALE}.json").exists()


def test_a_cluster_claimed_under_a_stale_ones_name_is_not_reaped(tmp_path, monkeypatch):
    """A run finds a cluster stale; before it tears it down, another run (`cluster up
    --name` of that name) removes it and claims the name: the first run's teardown removed
    the new cluster. Judged under the clusters' lock and taken over, the stale one is the
    first run's until it is gone, and the other run is told the name is taken."""
    _stale(tmp_path, monkeypatch)
    listed, go = threading.Event(), threading.Event()
    real = netns.list_clusters

    def listing():
        found = real()
        if threading.current_thread().name == "reaper":
            listed.set()
            go.wait(10)
        return found

    def build():
        reaped = netns.reap_stale()
        me = [os.getpid(), process_start_ticks(os.getpid()) or 0]
        mine = Cluster(STALE, 1e9, owner=me, ready=False)
        try:
            netns._claim(mine)
        except GradwireError as e:
            return reaped, str(e)
        return reaped, "claimed"

    builder = _Run("builder", build)
    torn = []

    def teardown(name: str) -> None:
        if threading.current_thread().name == "reaper":
            builder.join(10)  # the other run has claimed the name, or been refused it
        torn.append((threading.current_thread().name, name))
        (tmp_path / f"{name}.json").unlink(missing_ok=True)

    monkeypatch.setattr(netns, "list_clusters", listing)
    monkeypatch.setattr(netns, "_teardown", teardown)
    reaper = _Run("reaper", netns.reap_stale)
    reaper.start()
    try:
        assert listed.wait(10)
        builder.start()
    finally:
        go.set()
        reaper.join(10)
        builder.join(10)
    assert reaper.result == [STALE], reaper.result
    assert builder.result == ([], f"cluster {STALE} already exists"), builder.result
    assert torn == [("reaper", STALE)]
    assert not (tmp_path / f"{STALE}.json").exists()


# Reaps the stale clusters of GRADWIRE_STATE_DIR and dies as the first teardown starts.
_DIES_TEARING_DOWN = """
import os
from gradwire.cluster import netns
netns._teardown = lambda name: os._exit(9)
netns.reap_stale()
"""


def test_a_run_that_dies_removing_a_stale_cluster_leaves_it_stale_for_the_next(tmp_path,
                                                                              monkeypatch):
    """The run that took a stale cluster over owns it until it is gone: should it die half
    way, the cluster is stale again, says so, and the next run removes it."""
    import sys

    from gradwire.cluster import load_cluster

    _stale(tmp_path, monkeypatch)
    child = subprocess.Popen([sys.executable, "-c", _DIES_TEARING_DOWN],
                             stderr=subprocess.PIPE, text=True)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 9, err
    assert load_cluster(STALE).why_stale == (f"run {child.pid} exited half way through "
                                             "building or removing it")
    torn = []
    monkeypatch.setattr(netns, "_teardown", torn.append)
    assert netns.reap_stale() == [STALE] and torn == [STALE]


def test_the_machine_lock_is_held_in_the_temp_folder_where_there_is_no_run_lock(tmp_path,
                                                                                monkeypatch):
    """Without /run/lock (a container may lack it) the machine's settings lock is a file in
    the temp folder, and it is held: another open of it cannot take it until the block ends."""
    import tempfile

    real = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda p: str(p) != "/run/lock" and real(p))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    lock = tmp_path / "sysctl.lock"
    with netns._machine_lock("sysctl"):
        assert lock.exists() and not _lock_is_free(lock)
    assert _lock_is_free(lock)
