"""Options the CLI accepted and then ignored without a word or let crash later, and the hooks'
Lightning strategy taking a setting it cannot run with. Each runs in this process, with the
real work (a recording, a simulation, a prediction) replaced where it would start."""

import pytest
from conftest import Started, one_line_cli_error, run_cli, start_here

import gradwire.hooks as gh
from gradwire.errors import GradwireError
from gradwire.sim.trace import save, synthetic


@pytest.fixture
def here(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADWIRE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRADWIRE_STATE_DIR", str(tmp_path / "state"))
    save(synthetic("tiny", [1000, 2000, 3000], 0.01, 0.02), tmp_path / "in.jsonl")
    return tmp_path


# ---- gradwire trace: recording options with --from, layer options without --add-layers


@pytest.mark.parametrize("extra, said", [
    (["--iterations", "7"], "--iterations sets how --model is recorded: not with --from"),
    (["--seed", "3", "--batch-size", "8"], "--batch-size, --seed set how --model is recorded"),
    (["--layer-bytes", "8"], "--layer-bytes sets the layers --add-layers inserts"),
    (["--layer-forward-ms", "3", "--layer-backward-ms", "4"],
     "--layer-forward-ms, --layer-backward-ms set the layers --add-layers inserts"),
    (["--add-layers", "0", "--layer-bytes", "8"], "give --add-layers N too"),
])
def test_trace_refuses_options_an_edit_would_ignore(here, monkeypatch, capsys, extra, said):
    """`trace --from in.jsonl --iterations 7 -o out.jsonl` wrote a trace of the source's one
    iteration, and `--layer-bytes 8` without --add-layers added nothing: exit 0 either way."""
    code, _, err = run_cli(monkeypatch, capsys, ["trace", "--from", "in.jsonl", "-o", "out.jsonl",
                                                 *extra])
    one_line_cli_error(code, err, said)
    assert not (here / "out.jsonl").exists()


def test_trace_still_edits_and_records_with_the_options_that_apply(here, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, ["trace", "--from", "in.jsonl", "-o", "o.jsonl",
                                                   "--add-layers", "2", "--layer-bytes", "8"])
    assert code == 0 and "5 parameters" in out, err
    start_here(monkeypatch, "gradwire.sim.record", "record")
    code, _, err = run_cli(monkeypatch, capsys, ["trace", "--model", "mlp", "-o", "r.jsonl",
                                                 "--iterations", "2", "--seed", "1"],
                           started=(Started,))
    assert code == 0, err
    # a bad value is still named as such, before its option is found unused
    code, _, err = run_cli(monkeypatch, capsys, ["trace", "--model", "mlp", "-o", "r.jsonl",
                                                 "--layer-forward-ms", "inf"])
    one_line_cli_error(code, err, "--layer-forward-ms must be a number from 0 to")


def test_trace_refuses_to_write_over_the_trace_it_edits(here, monkeypatch, capsys):
    """`trace --from in.jsonl -o in.jsonl` replaced the source (a recording that may have
    taken long) with its edit, where every other command refuses to write over its input."""
    before = (here / "in.jsonl").read_text()
    code, _, err = run_cli(monkeypatch, capsys, ["trace", "--from", "in.jsonl", "-o",
                                                 "./in.jsonl", "--compute-speedup", "2"])
    one_line_cli_error(code, err, "is the file --from reads: the result would replace it")
    assert (here / "in.jsonl").read_text() == before


# ---- gradwire simulate: options --table or --sweep set themselves


@pytest.mark.parametrize("extra, said", [
    (["--table", "4", "--mechanism", "ring"], "--mechanism is not used with --table 4"),
    (["--table", "8", "--servers", "2"], "--servers is not used with --table 8, which runs 8 "
                                         "servers"),
    (["--table", "10", "--bandwidth", "1gbit"], "--bandwidth is not used with --table 10"),
    (["--sweep", "workers=2,4", "--workers", "8"], "--workers is not used with --sweep workers"),
    (["--sweep", "bandwidth=1gbit,10gbit", "--bandwidth", "5gbit"],
     "--bandwidth is not used with --sweep bandwidth"),
])
def test_simulate_refuses_options_a_table_or_sweep_overrides(here, monkeypatch, capsys, extra,
                                                             said):
    """`simulate --table 4 --mechanism ring` ran the table's mechanisms, `--table 8 --servers 2`
    8 servers, `--sweep workers=2,4 --workers 8` 2 and 4 workers: the option typed was dropped
    without a word."""
    start_here(monkeypatch, "gradwire.sim.simulate", "run_simulation")
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", "in.jsonl", *extra],
                           started=(Started,))
    one_line_cli_error(code, err, said)


@pytest.mark.parametrize("extra", [
    ["--table", "4"], ["--table", "4", "--servers", "2"], ["--table", "9", "--bandwidth", "1gbit"],
    ["--sweep", "workers=2,4", "--bandwidth", "5gbit"],
    ["--sweep", "speedup=1,2", "--workers", "8"],
])
def test_simulate_takes_the_options_a_table_or_sweep_reads(here, monkeypatch, capsys,
                                                           extra):
    start_here(monkeypatch, "gradwire.sim.simulate", "run_simulation")
    code, _, err = run_cli(monkeypatch, capsys, ["simulate", "--trace", "in.jsonl", *extra],
                           started=(Started,))
    assert code == 0, err


# ---- gradwire whatif and advise: --bucket-mb with --mode model


@pytest.mark.parametrize("command, work", [("whatif", ("gradwire.perf.whatif", "sweep")),
                                           ("advise", ("gradwire.perf.advise", "rank"))])
def test_bucket_cap_with_model_mode_is_refused(here, monkeypatch, capsys, command, work):
    """`--mode model --bucket-mb 5` predicted one whole-model bucket, the cap ignored."""
    start_here(monkeypatch, *work)
    code, _, err = run_cli(monkeypatch, capsys, [command, "--mode", "model", "--bucket-mb", "5"],
                           started=(Started,))
    one_line_cli_error(code, err, "--bucket-mb 5 is the DDP bucket cap of --mode bucket")
    for ok in (["--mode", "model"], ["--mode", "bucket", "--bucket-mb", "5"]):
        code, _, err = run_cli(monkeypatch, capsys, [command, *ok], started=(Started,))
        assert code == 0, err


# ---- the Lightning strategy


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_lightning_strategy_refuses_a_start_method_that_pickles_it(start):
    """`strategy(state, start_method="spawn")` was taken, and fit() then failed with
    "AttributeError: Can't pickle local object 'strategy.<locals>.GradwireDDPStrategy'"."""
    pytest.importorskip("lightning")
    from gradwire.hooks.lightning import strategy

    with pytest.raises(GradwireError, match=f"start_method='{start}' sends the strategy") as e:
        strategy(gh.make("topk"), process_group_backend="gloo", start_method=start)
    assert "\n" not in str(e.value)
    for fine in ("popen", "fork"):
        assert strategy(gh.make("topk"), start_method=fine)._start_method == fine


# ---- gradwire train: a sparsifier's options with a method that selects no elements


@pytest.mark.parametrize("agg, extra, said", [
    ("dense", ["--density", "0.01"], "--density sets the fraction of the elements a sparsifier "
     "sends (topk, gtopk, randomk, dgc): --agg dense selects none; leave it out"),
    ("powersgd", ["--density", "0.1", "--warmup"], "--density and --warmup set the fraction"),
    ("signsgd", ["--warmup"], "--warmup sets the fraction"),
])
def test_train_refuses_a_sparsifiers_options_for_another_method(here, monkeypatch, capsys, agg,
                                                                extra, said):
    """`train --agg dense --density 0.01` trained dense and reported nothing amiss: the hook
    of a method that selects no elements ignores the density and its warm-up."""
    start_here(monkeypatch, "gradwire.cli.train", "ephemeral_cluster")
    code, _, err = run_cli(monkeypatch, capsys, ["train", "--loopback", "--agg", agg, *extra],
                           started=(Started,))
    one_line_cli_error(code, err, said)


@pytest.mark.parametrize("args", [["--agg", "signsgd", "--no-warmup"],
                                  ["--agg", "topk", "--density", "0.01", "--warmup"],
                                  ["--agg", "dense"],
                                  # demo strips its --agg items; train refused " topk "
                                  ["--agg", " topk ", "--density", "0.01"]])
def test_train_takes_what_the_method_reads(here, monkeypatch, capsys, args):
    start_here(monkeypatch, "gradwire.cli.train", "ephemeral_cluster")
    code, _, err = run_cli(monkeypatch, capsys, ["train", "--loopback", *args],
                           started=(Started,))
    assert code == 0, err
