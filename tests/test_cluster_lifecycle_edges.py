"""Edges of an emulated cluster's life: state files gradwire never writes, a second signal
during a teardown, a signal while handlers are set back, and one that comes just as a run's
cluster is made."""

import json
import signal

import pytest
from conftest import cli_error, gradwire_leftovers, needs_netns, one_line_cli_error

from gradwire.cluster import Cluster, list_clusters, load_cluster, netns
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted, on_signals

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _host(rank, name="gwaaaaaa", i=0):
    return {"rank": rank, "netns": f"{name}-h{i}", "addr": f"10.213.9.{i + 1}", "ifname": "eth0"}


def _state(hosts, **more):
    return json.dumps({"name": "gwaaaaaa", "bandwidth_bps": 1e9, "hosts": hosts, **more})


@pytest.fixture
def state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    return tmp_path


def test_a_state_file_of_nested_brackets_is_unreadable_not_a_traceback(state_dir, monkeypatch,
                                                                      capsys):
    """json.loads raised RecursionError, which no reader caught: every `cluster up` (which
    lists the clusters to reap the stale ones) and `cluster status` on the machine failed with
    a traceback until the file was removed by hand."""
    (state_dir / "gwbbbbbb.json").write_text("[" * 100_000 + "]" * 100_000)
    assert list_clusters() == []
    with pytest.raises(GradwireError, match="gwbbbbbb.json is unreadable"):
        load_cluster("gwbbbbbb")
    from gradwire import cli

    monkeypatch.setattr("sys.argv", ["gradwire", "cluster", "status"])
    cli.main()
    assert "gwbbbbbb" in capsys.readouterr().out


@pytest.mark.parametrize("text", [
    _state([_host(False), _host(True, i=1)]),  # ranks that only compare equal to 0, 1
    _state([_host(0.0)]),
    _state([_host(i, i=i) for i in range(251)], ready=False),
], ids=["bool-ranks", "float-rank", "too-many-hosts"])
def test_a_state_file_gradwire_never_writes_is_refused_in_one_line(text, state_dir, monkeypatch,
                                                                   capsys):
    """Ranks false and true passed the order check (False == 0) and went to the ranks as
    RANK=False."""
    with pytest.raises(ValueError):
        Cluster.from_json(text)
    (state_dir / "gwaaaaaa.json").write_text(text)
    assert list_clusters() == []
    code, err = cli_error(monkeypatch, capsys, "run", "--cluster", "gwaaaaaa", "--", "true")
    one_line_cli_error(code, err, "gwaaaaaa.json is unreadable")


@pytest.mark.parametrize("ready", [True, False])
def test_a_run_on_a_cluster_of_no_hosts_is_refused_in_one_line(ready, state_dir, monkeypatch,
                                                               capsys):
    """A cluster of no hosts (a state file edited by hand) passed for live, and a run on it
    failed with an IndexError traceback (launch's ``cluster.hosts[0]``)."""
    (state_dir / "gwaaaaaa.json").write_text(_state([], ready=ready))
    from gradwire.launcher import launch

    with pytest.raises(GradwireError, match="has no hosts"):
        launch(load_cluster("gwaaaaaa"), ["true"])
    code, err = cli_error(monkeypatch, capsys, "run", "--cluster", "gwaaaaaa", "--", "true")
    one_line_cli_error(code, err, "gwaaaaaa" if ready else "still being built")


def test_a_state_file_gradwire_writes_still_reads():
    text = _state([_host(0), _host(1, i=1)], ready=True, subnet=9)
    assert [h.rank for h in Cluster.from_json(text).hosts] == [0, 1]
    assert Cluster.from_json(_state([], ready=False)).hosts == []  # claimed, no host made yet


def _handlers():
    return {s: signal.getsignal(s) for s in STOPS}


@needs_netns
def test_a_second_signal_during_the_teardown_keeps_the_first_ones_exit(monkeypatch):
    """The teardown held a second signal until it was done, then delivered it: its
    Interrupted replaced the first's, so `gradwire run` said "interrupted by SIGTERM; cleaned
    up" (the stopped ranks lost) and a Ctrl-C then SIGTERM exited 143, not 130."""
    before = _handlers()
    real, names = netns._remove, []

    def remove(name):
        names.append(name)
        signal.raise_signal(signal.SIGTERM)  # a second signal, as the teardown starts
        real(name)

    monkeypatch.setattr(netns, "_remove", remove)
    with pytest.raises(Interrupted) as e, netns.ephemeral_cluster(1, "1gbit"):
        raise Interrupted(signal.SIGINT, 2)  # the first: the launch stopped 2 ranks
    assert (e.value.signum, e.value.stopped) == (signal.SIGINT, 2)
    assert names and gradwire_leftovers(names[0]) == []
    assert _handlers() == before


def test_a_signal_during_a_teardown_with_nothing_under_way_is_still_delivered(monkeypatch):
    """Only a signal that comes while a stop signal is already acted on is done with: one
    during a teardown that nothing interrupted ends the run once the teardown is done."""
    removed = []

    def remove(name):
        signal.raise_signal(signal.SIGTERM)
        removed.append(name)

    monkeypatch.setattr(netns, "_remove", remove)
    with pytest.raises(Interrupted) as e, netns._signals_raise():
        netns._teardown("gwaaaaaa")
    assert e.value.signum == signal.SIGTERM and removed == ["gwaaaaaa"]


class _Stop(Exception):
    pass


def test_a_signal_while_the_handlers_are_set_back_leaves_none_of_them_replaced(monkeypatch):
    """A signal that came while on_signals set the old handlers back ran the old handler of
    its signal, which raised: the handlers after it were left replaced for good (a teardown's,
    which only notes a signal, swallowed every later one)."""
    first, second = signal.SIGUSR1, signal.SIGUSR2
    seen = []

    def original(signum, _frame):
        seen.append(signum)
        raise _Stop(signum)

    keep = {s: signal.signal(s, original) for s in (first, second)}
    try:
        real = signal.signal
        came = []

        def setting(sig, h):
            old = real(sig, h)
            if sig == first and h is original and not came:  # first set back: a signal comes
                came.append(sig)
                signal.raise_signal(first)
            return old

        monkeypatch.setattr(signal, "signal", setting)
        with pytest.raises(_Stop), on_signals(lambda s: None, (first, second)):
            pass
        monkeypatch.undo()
        assert seen == [first]  # delivered to its own handler, once
        assert signal.getsignal(first) is original and signal.getsignal(second) is original
    finally:
        for s, h in keep.items():
            signal.signal(s, h)


@needs_netns
def test_a_signal_as_the_runs_cluster_is_made_still_removes_it(monkeypatch):
    """A signal that came once cluster_up had returned, before ephemeral_cluster held the
    cluster, left the run's cluster up (namespaces, bridge, state file) until the next
    cluster made on the machine reaped it."""
    real, made = netns.cluster_up, []

    def cluster_up(*args, **kwargs):
        made.append(real(*args, **kwargs))
        raise Interrupted(signal.SIGTERM)  # as if it came on the way back

    monkeypatch.setattr(netns, "cluster_up", cluster_up)
    try:
        with pytest.raises(Interrupted), netns.ephemeral_cluster(1, "1gbit"):
            pytest.fail("the block ran")
        assert made and gradwire_leftovers(made[0].name) == []
        with pytest.raises(GradwireError, match="no cluster named"):
            load_cluster(made[0].name)
    finally:
        for c in made:
            netns.cluster_down(c.name) if gradwire_leftovers(c.name) else None


@needs_netns
def test_a_name_taken_by_another_cluster_is_not_removed_by_the_run_that_found_it(monkeypatch):
    """ephemeral_cluster removes what its state file says this process made, nothing else."""
    other = netns.cluster_up(1, "1gbit")
    try:
        monkeypatch.setattr(netns.secrets, "token_hex", lambda n: other.name[2:])
        with pytest.raises(GradwireError, match="already exists"), \
                netns.ephemeral_cluster(1, "1gbit"):
            pytest.fail("the block ran")
        assert load_cluster(other.name).ready
        assert gradwire_leftovers(other.name) != []
    finally:
        netns.cluster_down(other.name)
