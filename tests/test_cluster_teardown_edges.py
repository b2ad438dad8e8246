"""What a failure, a signal or another process leaves of an emulated cluster: a `cluster up`
killed half way, a `cluster down` of several clusters that a signal reaches after the first,
a state file that another process removes while it is read, and a temporary state file that
a killed write left."""

import os
import secrets
import signal
import subprocess
import sys

import pytest
from conftest import gradwire_leftovers, needs_netns

from gradwire.cluster import list_clusters, load_cluster, netns, state
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted, on_signals


@pytest.fixture
def state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    return tmp_path


def _name() -> str:
    return f"gw{secrets.token_hex(3)}"


# Builds host 0 of a three-host cluster, then dies by SIGKILL as host 1 starts: nothing of it
# runs any clean-up.
_KILLED_BUILD = """
import os, signal, sys
from gradwire.cluster import netns
real = netns._add_host
def add(cluster, host, *args):
    if host.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(cluster, host, *args)
netns._add_host = add
netns.cluster_up(3, "none", name=sys.argv[1])
"""


@needs_netns
def test_a_cluster_up_killed_half_way_is_stale_and_the_next_cluster_removes_it(state_dir):
    """A `gradwire cluster up` killed while it made its hosts (SIGKILL, the OOM killer) left
    its state file not ready and with no owner: never stale, so no later cluster removed it,
    and its namespaces, veths and bridge stayed until someone ran `cluster down` by hand."""
    name = _name()
    p = subprocess.run([sys.executable, "-c", _KILLED_BUILD, name], capture_output=True,
                       text=True, timeout=60, env={**os.environ})
    try:
        assert p.returncode == -signal.SIGKILL, p.stderr
        c = load_cluster(name)
        assert not c.ready and gradwire_leftovers(name) != []  # host 0 and the bridge
        assert c.stale, "a build whose process is gone is stale"
        assert netns.reap_stale() == [name]
        assert gradwire_leftovers(name) == [] and list_clusters() == []
    finally:
        netns._teardown(name)


@needs_netns
def _state_only_clusters(state_dir, monkeypatch, count: int = 3) -> list[str]:
    """``count`` clusters known only by their state files (nothing to build), in name order;
    `cluster down --all` sees only them, never another run's on a machine that has some."""
    names = sorted(_name() for _ in range(count))
    for n in names:
        (state_dir / f"{n}.json").write_text("{}")
    monkeypatch.setattr(netns, "_orphans", lambda out: set())
    return names


def test_a_signal_during_down_of_several_clusters_still_removes_them_all(state_dir,
                                                                         monkeypatch):
    """`cluster down --all` delivered a Ctrl-C that came during the first cluster's teardown as
    soon as that one was done: it stopped there, said "interrupted ...; cleaned up", and left
    every other cluster up."""
    names = _state_only_clusters(state_dir, monkeypatch)
    real, seen = netns.remove_hosts_files, []

    def remove_hosts_files(name):
        seen.append(name)
        if len(seen) == 1:
            signal.raise_signal(signal.SIGTERM)  # Ctrl-C, SIGTERM: during the first teardown
        real(name)

    def stop(signum):
        raise Interrupted(signum)

    monkeypatch.setattr(netns, "remove_hosts_files", remove_hosts_files)
    with pytest.raises(Interrupted) as e, on_signals(stop, (signal.SIGTERM,)):
        netns.cluster_down(all_=True)
    assert e.value.signum == signal.SIGTERM
    assert seen == names and not list(state_dir.glob("gw*.json"))


def test_a_state_file_removed_while_it_is_read_is_no_cluster_not_an_oserror(state_dir,
                                                                           monkeypatch):
    """`gradwire run --cluster NAME` or `cluster status` while another process ran `cluster
    down NAME`: the file was there when looked for and gone when read, and load_cluster raised
    FileNotFoundError (status stopped at it) instead of saying there is no such cluster."""
    name = _name()
    (state_dir / f"{name}.json").write_text("{}")
    real = state._read

    def read(path):
        path.unlink()  # the other process's `cluster down`, just now
        return real(path)

    monkeypatch.setattr(state, "_read", read)
    with pytest.raises(GradwireError, match=f"no cluster named {name}"):
        load_cluster(name)


@needs_netns
def test_down_removes_the_temporary_state_file_of_a_write_that_was_killed(state_dir,
                                                                         monkeypatch):
    """A state file is written beside itself (``.NAME.json.PID.tmp``) and renamed: a process
    killed between the two (SIGKILL during the fsync) left the temporary, which no `cluster
    down` or reap removed, for ever."""
    name = _name()
    (state_dir / f"{name}.json").write_text("{}")
    left = state_dir / f".{name}.json.4242.tmp"
    left.write_text('{"name": "')
    other = state_dir / f".{_name()}.json.4242.tmp"  # another cluster's: left alone
    other.write_text("")
    assert netns.cluster_down(name) == [name]
    assert not left.exists() and not (state_dir / f"{name}.json").exists()
    assert other.exists()


def test_a_teardown_that_fails_leaves_the_other_clusters_removed(state_dir, monkeypatch):
    """`cluster down --all` stopped at the first cluster whose teardown raised an OSError (a
    state folder made read-only, a hosts file it could not remove): the rest stayed up. Now
    every other one is removed, and the failure is one line naming it."""
    names = _state_only_clusters(state_dir, monkeypatch)
    real, seen = netns.remove_hosts_files, []

    def remove_hosts_files(name):
        seen.append(name)
        if name == names[0]:
            raise PermissionError(13, "Permission denied")
        real(name)

    monkeypatch.setattr(netns, "remove_hosts_files", remove_hosts_files)
    with pytest.raises(GradwireError, match=rf"could not remove cluster {names[0]}: "
                                            r"Permission denied; the 2 other\(s\) were removed"):
        netns.cluster_down(all_=True)
    assert seen == names
    assert [f.stem for f in state_dir.glob("gw*.json")] == [names[0]]


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_state_path_that_is_no_file_is_skipped_not_read(state_dir, kind):
    """A folder named like a state file raised IsADirectoryError at every `cluster status`
    and cluster up; a FIFO hung them, waiting for a writer."""
    path = state_dir / f"{_name()}.json"
    if kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    assert list_clusters() == []
    with pytest.raises(GradwireError, match="is unreadable .*not a regular file"):
        load_cluster(path.stem)
