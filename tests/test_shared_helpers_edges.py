"""Edges of the shared helpers: signal handlers set while a signal comes, a figure named
without an extension, and seeds too large for torch's generator."""

import signal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.data import shard_indices
from gradwire.interrupts import on_signals
from gradwire.sizes import format_size, parse_sizes


class _Stop(Exception):
    pass


def test_a_signal_while_the_handlers_are_set_leaves_none_of_them_replaced(monkeypatch):
    """A signal that came while on_signals set its handlers (one of them already set, and
    raising) left the block before its ``try``: the handlers already set stayed for good, the
    original ones lost."""
    first, second = signal.SIGUSR1, signal.SIGUSR2
    before = {s: signal.getsignal(s) for s in (first, second)}
    real = signal.signal

    def setting(sig, h):
        if sig == second and h not in before.values():
            signal.raise_signal(first)  # as if it came now: its new handler raises
        return real(sig, h)

    def handler(signum):
        raise _Stop(signum)

    monkeypatch.setattr(signal, "signal", setting)
    with pytest.raises(_Stop), on_signals(handler, (first, second)):
        pytest.fail("the block ran")
    monkeypatch.undo()
    assert {s: signal.getsignal(s) for s in (first, second)} == before


def test_a_figure_named_without_an_extension_is_written_in_the_default_format(tmp_path):
    """save_figure wrote to its temporary (``.fig.PID.tmp``) with no format given, so
    matplotlib took the format from the temporary's name: "Format 'tmp' is not supported"
    for a path that matplotlib itself writes as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gradwire.jsonfile import save_figure

    path = tmp_path / "fig"
    assert save_figure(plt.figure(), path, dpi=20) == path
    assert path.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig"]


def test_a_large_seed_shards_instead_of_a_traceback():
    """shard_indices takes any seed >= 0, but seeded torch with seed * 1000003 + epoch:
    past 2**64 that was ValueError("Overflow when unpacking long long")."""
    shards = [shard_indices(10, r, 3, 2, 2**60) for r in range(3)]
    assert all(len(s) == 3 for s in shards)
    assert len({i for s in shards for i in s.tolist()}) == 9
    # a seed that worked deals the samples as it did
    g = torch.Generator().manual_seed(7 * 1_000_003 + 1)
    assert shard_indices(10, 0, 1, 1, 7).tolist() == torch.randperm(10, generator=g).tolist()


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 300), st.integers(1, 40), st.integers(0, 5), st.integers(0, 2**70))
def test_shards_are_disjoint_equal_and_drop_less_than_a_world(n, world, epoch, seed):
    shards = [shard_indices(n, r, world, epoch, seed).tolist() for r in range(world)]
    flat = [i for s in shards for i in s]
    assert len({len(s) for s in shards}) == 1
    assert len(set(flat)) == len(flat) and set(flat) <= set(range(n))
    assert n - len(flat) < world


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 2**45))
def test_a_size_reads_back_from_what_it_prints(n):
    assert parse_sizes(format_size(n)) == [n]


def test_a_list_of_numbers_takes_an_empty_item_as_the_lists_of_names_do():
    """``--sizes 1K,4M,`` said "size '' is not valid" (naming no option) and
    ``--compute-speedup 1,2,`` "'' is not a number", while ``--agg dense,topk,`` and
    ``--algo ring,`` ran; a list of nothing but commas is one line naming the option."""
    from gradwire.check import parse_numbers
    from gradwire.errors import GradwireError

    assert parse_sizes("1K,4M,") == parse_sizes(" ,1K,,4M") == [1024, 4 * 2**20]
    assert parse_numbers("--compute-speedup", "1,2,") == [1.0, 2.0]
    with pytest.raises(GradwireError, match=r"^', ' names no size: expected a size like"):
        parse_sizes(", ")
    with pytest.raises(GradwireError, match=r"^--compute-ms ',' names no number"):
        parse_numbers("--compute-ms", ",")


@pytest.mark.parametrize("args, msg", [
    (["bench", "--sizes", ","], "--sizes: ',' names no size: expected a size like"),
    (["bench", "--sizes", "1X"], "--sizes: size '1X' is not valid"),
    (["whatif", "--model", "resnet50", "--bandwidth", ","],
     "--bandwidth ',' names no link rate: expected a comma list such as 1gbit,10gbit"),
    (["whatif", "--model", "resnet50", "--workers", ","],
     "--workers ',': ',' names no worker count: expected a worker count like"),
])
def test_an_empty_list_is_one_line_naming_its_option(monkeypatch, capsys, args, msg):
    from conftest import cli_error, one_line_cli_error

    code, err = cli_error(monkeypatch, capsys, *args)
    one_line_cli_error(code, err, msg)


def test_whatif_takes_a_trailing_comma_in_its_lists(monkeypatch, capsys):
    from conftest import run_cli

    code, out, err = run_cli(monkeypatch, capsys, [
        "whatif", "--model", "resnet50", "--workers", "8,16,", "--bandwidth", "1gbit,10gbit,",
        "--compute-speedup", "1,"])
    assert code == 0, err
    assert sum(line.split() == ["1gbit", "10gbit"] for line in out.splitlines()) == 2
