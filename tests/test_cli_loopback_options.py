"""A link rate or an MTU typed with --loopback is refused in one line: loopback shapes nothing
and keeps its own MTU, so they were ignored without a word. An unshaped --bandwidth (none,
unlimited) is what loopback is, and is taken."""

import pytest
from conftest import Started, cli_error, one_line_cli_error, run_cli, start_here

COMMANDS = [["bench"], ["calibrate"], ["train"], ["demo"], ["run", "--loopback", "--", "true"]]


def _args(command: list[str], *extra: str) -> list[str]:
    if command[0] == "run":  # its options before the command the ranks run
        return ["run", *extra, *command[1:]]
    return [*command, "--loopback", *extra]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("extra,needle", [
    (["--bandwidth", "1gbit"], "--bandwidth 1gbit shapes the emulated hosts' links; "
                               "--loopback runs without them"),
    (["--mtu", "9000"], "--mtu 9000 sets the emulated hosts' links' MTU; --loopback runs "
                        "without them"),
])
def test_a_rate_or_mtu_typed_with_loopback_is_one_line(monkeypatch, capsys, command, extra,
                                                       needle):
    for module in ("gradwire.cli.options", "gradwire.cli.train"):
        start_here(monkeypatch, module, "ephemeral_cluster")  # nothing is made or run
    code, err = cli_error(monkeypatch, capsys, *_args(command, *extra))
    one_line_cli_error(code, err, needle, "give one of them")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("word", ["none", "unlimited"])
def test_an_unshaped_rate_with_loopback_is_taken(monkeypatch, capsys, command, word):
    for module in ("gradwire.cli.options", "gradwire.cli.train"):
        start_here(monkeypatch, module, "ephemeral_cluster")
    code, _, err = run_cli(monkeypatch, capsys, _args(command, "--bandwidth", word),
                           started=(Started,))
    assert code == 0, err
