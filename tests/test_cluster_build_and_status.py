"""A big emulated cluster's build shows progress: `gradwire cluster up --hosts 64` ran silent
for 6 to 7 s (about 25 s at 250 hosts) before its table, and a bench, train or simulate run
on as many hosts sat as long before its ranks' bar. A stop that comes while the build's
progress is shown still removes every host made. `cluster status` names what a cluster
left behind when its state file is gone."""

import contextlib
import json
import secrets
import signal
import subprocess

import pytest
from conftest import gradwire_cli, gradwire_leftovers, needs_netns, run_cli

from gradwire.cluster import cluster_down, cluster_up, list_clusters
from gradwire.errors import GradwireError
from gradwire.interrupts import Interrupted
from gradwire.jobs import BUILD_PROGRESS_HOSTS


@needs_netns
def test_a_big_cluster_up_says_its_progress_when_piped_and_a_small_one_says_nothing():
    big, small = (f"gw{secrets.token_hex(3)}" for _ in range(2))
    try:
        made = gradwire_cli("cluster", "up", "--hosts", str(BUILD_PROGRESS_HOSTS), "--name", big)
        quiet = gradwire_cli("cluster", "up", "--hosts", "2", "--name", small)
    finally:
        gradwire_cli("cluster", "down", big)
        gradwire_cli("cluster", "down", small)
    assert made.returncode == 0 and quiet.returncode == 0, made.stderr + quiet.stderr
    n = BUILD_PROGRESS_HOSTS
    said = [line.split(" (")[0] for line in made.stderr.splitlines()]
    assert said == [f"gradwire cluster up: {q * n // 4}/{n} done" for q in (1, 2, 3, 4)], said
    assert f"{big}-h{n - 1}" in made.stdout  # the table still follows
    assert quiet.stderr == "", quiet.stderr
    assert not gradwire_leftovers(big) and not gradwire_leftovers(small)


@needs_netns
def test_progress_is_shown_during_the_build_only_and_a_stop_in_it_removes_every_host():
    seen: list[tuple[int, int]] = []
    events: list[str] = []

    @contextlib.contextmanager
    def progress():
        events.append("enter")
        yield lambda done, total: seen.append((done, total))
        events.append("exit")

    c = cluster_up(3, "1gbit", progress=progress)
    try:
        assert events == ["enter", "exit"]  # closed before the cluster is handed over
        assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]
    finally:
        cluster_down(c.name)

    name = f"gw{secrets.token_hex(3)}"

    def stop(done: int, total: int) -> None:
        if done == 2:  # two hosts made: a Ctrl-C while the bar redraws
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cluster_up(4, "1gbit", name=name, progress=lambda: contextlib.nullcontext(stop))
    assert not gradwire_leftovers(name)
    assert name not in {x.name for x in list_clusters()}


@needs_netns
def test_status_names_a_cluster_left_with_no_state_file():
    """A cluster whose state file was lost (a killed run, another GRADWIRE_STATE_DIR's) was
    missing from `cluster status`, though `cluster down NAME` removed it: a user learnt its
    name only from `ip netns list`."""
    from gradwire.config import state_dir

    name = f"gw{secrets.token_hex(3)}"
    cluster_up(1, "none", name=name)
    try:
        (state_dir() / f"{name}.json").unlink()
        table = gradwire_cli("cluster", "status", columns=200)
        as_json = gradwire_cli("cluster", "status", "--json")
    finally:
        gradwire_cli("cluster", "down", name)
    assert f"left behind: {name}, namespaces or links with no state file" in table.stdout
    assert name not in as_json.stdout and f"left behind: {name}" in as_json.stderr
    assert not gradwire_leftovers(name)


def test_a_cluster_removed_while_status_lists_the_machine_is_not_left_behind(monkeypatch,
                                                                           tmp_path):
    """orphan_clusters read the state files after listing namespaces and links: a cluster that
    another process removed in between (its state file last) was "left behind"."""
    from gradwire.cluster import netns

    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path))
    gone = tmp_path / "gw00dd01.json"
    gone.write_text("{}")

    def listed(out: str) -> set[str]:
        gone.unlink()  # its `cluster down` ends while the machine is listed
        return {"gw00dd01", "gw00dd02"}

    monkeypatch.setattr(netns, "_orphans", listed)
    assert netns.orphan_clusters() == ["gw00dd02"]


def _ip_json(ns: str, *args: str) -> list[dict]:
    return json.loads(subprocess.run(["ip", "-n", ns, "-j", *args], capture_output=True,
                                     text=True, check=True).stdout)


@needs_netns
def test_every_host_knows_every_other_hosts_mac_for_good():
    """The kernel keeps one neighbour table for every namespace, of at most gc_thresh3 entries
    (1024 by default), and a gloo world connects every pair of ranks: past about 32 hosts
    connections failed (`No route to host`, "neighbor table overflow!"), and a full mesh of
    64 hosts took minutes. Permanent entries are not counted against it."""
    c = cluster_up(3, "none")
    try:
        macs = {h.addr: _ip_json(h.netns, "link", "show", "eth0")[0]["address"]
                for h in c.hosts}
        known = {h.addr: _ip_json(h.netns, "-4", "neigh", "show", "dev", "eth0")
                 for h in c.hosts}
    finally:
        cluster_down(c.name)
    assert len(set(macs.values())) == 3, macs
    for addr, entries in known.items():
        assert {e["dst"]: e["lladdr"] for e in entries} == {
            a: mac for a, mac in macs.items() if a != addr}, entries
        assert all(e["state"] == ["PERMANENT"] for e in entries), entries


@needs_netns
def test_a_cluster_up_stopped_before_its_table_is_printed_removes_the_cluster(monkeypatch,
                                                                             capsys):
    """A stop that came once the cluster was built, while `cluster up` printed it, ended in
    "interrupted by SIGTERM; cleaned up", exit status 143, and left the whole cluster up, its
    name not yet shown."""
    import gradwire.cli.cluster

    name = f"gw{secrets.token_hex(3)}"

    def stopped(c):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(gradwire.cli.cluster, "hosts_table", stopped)
    try:
        code, _, err = run_cli(monkeypatch, capsys, ["cluster", "up", "--hosts", "2",
                                                     "--bandwidth", "none", "--name", name])
        left = gradwire_leftovers(name)
    finally:
        with contextlib.suppress(GradwireError):
            cluster_down(name)
    assert (code, err) == (143, "gradwire: interrupted by SIGTERM; cleaned up\n")
    assert left == [] and name not in {c.name for c in list_clusters()}
