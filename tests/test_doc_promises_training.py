"""Promises docs/training.md and docs/reliability.md make to a user that no other test held
to: resuming bit for bit for every method and mode the page names, what a checkpoint holds and
how it is written, the fused optimizer, the models and data tables, an epoch's shards, the
table's perplexity and n/a, the figure's four panels, the steady epochs and the overall
figures, the demo's settings and its fixed momentum and warm-up, the error lines shown
verbatim, the hooks' call headers until the ranks agree, the launcher's SIGTERM, SIGCONT and
SIGKILL to each rank's process group, and a checkpoint that holds pickled code."""

import contextlib
import dataclasses
import io
import math
import os
import re
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, alive, cli_error, one_line_cli_error, pids_in, run_cli, run_world
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradwire.hooks as gh

TRAINING = ROOT / "docs" / "training.md"

# ---- training.md, Checkpoints: resuming bit for bit

# "Every method in `--mode model` ... and dense, fp16, bf16 and signsgd ... in either mode
# resume bit for bit. In `--mode bucket`, topk, gtopk and efsignsgd do so where the gradients
# fit one bucket (`mlp-small`)". tests/test_train.py holds dense and topk in bucket mode and
# PowerSGD in model mode; these are the rest.
RESUMED = [(m, "model") for m in gh.METHODS] + [
    (m, "bucket") for m in ("dense", "fp16", "bf16", "signsgd", "topk", "gtopk", "efsignsgd")]
# the methods that agree on the NaN/Inf status in a header before compressing
# (reliability.md): a header per bucket every step
STATUS_IN_HEADER = ("qsgd", "terngrad", "signsgd", "efsignsgd", "dgc", "randomk")


def _resumes(rank: int, world: int, folder: str, cases: list) -> dict:
    """For each (method, mode): a 2-epoch run, and a run resumed to 2 epochs from that run's
    checkpoint after epoch 1 (kept as it was written: what a run stopped there leaves), both
    through the training worker's own parse_args and train, with --checkpoint, so that the
    final parameters of both can be compared bit for bit on the host."""
    import functools
    import shutil

    import gradwire.data
    from gradwire.train import checkpoint, worker

    os.environ["WORLD_SIZE"] = str(world)  # as a launcher sets it: parse_args checks it
    # the digits file, parsed once rather than twice a run (a third of a run's time here)
    gradwire.data.digits_arrays = functools.cache(gradwire.data.digits_arrays)
    save = checkpoint.save

    def keep_epoch_1(path, state):
        save(path, state)
        if state["epoch"] == 1:
            shutil.copyfile(path, str(path).replace("-whole.pt", ".pt"))

    checkpoint.save = keep_epoch_1
    out = {}
    for agg, mode in cases:
        # batch 359: two iterations an epoch at P = 2, so DDP rebuilds its buckets in the
        # first epoch and the resumed run's first iteration sees them in parameter order
        base = ["--model", "mlp-small", "--agg", agg, "--mode", mode, "--density", "0.05",
                "--no-warmup", "--batch-size", "359", "--epochs", "2"]
        name = f"{folder}/{agg}-{mode}"
        with contextlib.redirect_stdout(io.StringIO()):  # rank 0's progress lines
            whole = worker.train(worker.parse_args([*base, f"--checkpoint={name}-whole.pt"]))
            rest = worker.train(worker.parse_args([*base, f"--checkpoint={name}.pt",
                                                   "--resume"]))
        if rank == 0:
            out[f"{agg}-{mode}"] = {"whole": whole, "rest": rest}
    return out


def test_every_method_the_page_names_resumes_bit_for_bit(tmp_path):
    """training.md: "Every method in `--mode model` (whose checkpoint records the element order
    of its aggregation) and dense, fp16, bf16 and signsgd (its vote is element by element) in
    either mode resume bit for bit. In `--mode bucket`, topk, gtopk and efsignsgd do so where
    the gradients fit one bucket (`mlp-small`)"; "the result (curves, final parameters, loss)
    is the same as that of a run that never stopped".

    Also, from the same runs: "payload MB/iter ... (dense: the fp32 gradient)"; the JSON's
    `header` is "none in steady state without a density warm-up", but for the methods that
    "exchange a header per bucket, with the status" (reliability.md); and the JSON has the
    fields the table's rows name (`header`, `cpu_s_per_iter`, `cpu_main_s_per_iter`,
    `cpu_hook_s_per_iter`, `test_loss`); and "`--checkpoint PATH` saves, after every epoch,
    one file ... with the model, the optimizer's momentum buffers, **every rank's** aggregation
    state (the error-feedback residuals differ per rank), the per-epoch history and the
    settings"."""
    got = run_world(_resumes, 2, tmp_path, str(tmp_path), RESUMED)[0]
    for agg, mode in RESUMED:
        name = f"{agg}-{mode}"
        whole, rest = got[name]["whole"], got[name]["rest"]
        for key in ("loss", "test_loss", "test_accuracy", "parameter_checksum"):
            assert rest[key] == whole[key], (name, key, rest[key], whole[key])
        a = torch.load(tmp_path / f"{name}-whole.pt", weights_only=True)["model"]
        b = torch.load(tmp_path / f"{name}.pt", weights_only=True)["model"]
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), (name, "final parameters differ")
        # the steady epoch (the second: the first is the process's) exchanged headers only
        # where the method carries its NaN/Inf status in one
        header = whole["seconds_per_iter"]["header"]
        assert (header > 0) if agg in STATUS_IN_HEADER else (header == 0), (name, header)
        for key in ("cpu_s_per_iter", "cpu_main_s_per_iter", "cpu_hook_s_per_iter"):
            assert whole[key] > 0, (name, key)
        assert len(whole["test_loss"]) == 2
        if agg == "dense":
            assert whole["payload_bytes_per_iter_per_rank"] == 4 * whole["parameters"]
        if agg == "topk":
            _holds_every_ranks_state(tmp_path / f"{name}-whole.pt")


def _holds_every_ranks_state(path: Path) -> None:
    """What a 2-epoch, 2-rank topk run's checkpoint holds (see the test below)."""
    from gradwire.train import checkpoint

    saved = checkpoint.load(path)
    assert saved["epoch"] == 2
    assert {k: saved["settings"][k] for k in ("model", "agg", "world_size")} == {
        "model": "mlp-small", "agg": "topk", "world_size": 2}
    assert len(saved["aggregation"]) == 2
    r0, r1 = (s["residuals"] for s in saved["aggregation"])
    assert r0 and r0.keys() == r1.keys()
    assert any(not torch.equal(r0[k], r1[k]) for k in r0), "the ranks' residuals are the same"
    params = list(saved["model"].values())
    buffers = [s["momentum_buffer"] for s in saved["optimizer"]["state"].values()]
    assert [b.shape for b in buffers] == [p.shape for p in params]
    assert saved["history"] and all(len(v) == 2 for v in saved["history"].values())


def test_a_checkpoint_is_written_beside_its_path_then_renamed(tmp_path, monkeypatch):
    """training.md: "`--checkpoint PATH` saves, after every epoch, one file (written to a
    temporary file beside it, then renamed)"."""
    from gradwire.train import checkpoint

    ck = tmp_path / "ck.pt"
    ck.write_bytes(b"the epoch before")
    renames = []
    real = os.replace

    def replace(src, dst, *a, **k):
        renames.append((Path(src), Path(dst), Path(src).stat().st_size))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    state = {"epoch": 1, "settings": {"model": "mlp-small"}, "model": {"w": torch.ones(3)},
             "optimizer": {}, "aggregation": [{}], "history": {}}
    checkpoint.save(ck, state)
    assert len(renames) == 1
    src, dst, size = renames[0]
    assert dst == ck and src.parent == ck.parent and src.name != ck.name and size > 16
    assert not src.exists() and [p.name for p in tmp_path.iterdir()] == ["ck.pt"]
    assert torch.equal(checkpoint.load(ck)["model"]["w"], torch.ones(3))


# ---- training.md: the optimizer

def test_every_run_steps_torchs_fused_sgd_where_torch_has_it():
    """training.md: "the optimizer is torch's fused SGD where the torch in use has it
    (`gradwire.models.task.optimizer`): every method gets both"."""
    from gradwire.models import build_model
    from gradwire.models.task import optimizer
    from gradwire.train import worker

    params = list(build_model("mlp-small").parameters())
    try:
        torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    except (RuntimeError, TypeError, ValueError):
        pytest.skip("this torch has no fused SGD on CPU")
    opt = optimizer(params, 0.05, 0.9)
    assert opt.defaults["fused"] is True
    assert (opt.defaults["lr"], opt.defaults["momentum"]) == (0.05, 0.9)
    assert worker.optimizer is optimizer  # what the training worker steps, for every method


# ---- training.md, Models and data

def _doc_models_table() -> dict[str, tuple[str, str]]:
    """The page's models table: name -> (parameters, data)."""
    rows = {}
    for line in TRAINING.read_text().splitlines():
        m = re.match(r"\| `([a-z0-9-]+)` \| ([^|]+) \| ([^|]+) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


def _round_like(n: int, shown: str) -> str:
    """``n`` written the way ``shown`` (1.13 M, 26 k, 0.27 M) writes a count."""
    value, unit = shown.split()
    scale = {"M": 1e6, "k": 1e3}[unit]
    digits = len(value.split(".")[1]) if "." in value else 0
    return f"{n / scale:.{digits}f} {unit}"


def test_the_models_table_gives_each_models_size_and_data(monkeypatch, capsys):
    """training.md, Models and data: `mlp` 1.13 M on digits, `mlp-small` 26 k, `resnet20`
    0.27 M, `resnet50` 23.5 M, `vgg16` 15.2 M, `lstm` 0.89 M on stdlib text; and `gradwire
    models` ("what --model accepts, sizes, data") lists the same, counted from the models as
    the runs build them."""
    from gradwire.models import MODELS

    table = _doc_models_table()
    assert list(table) == list(MODELS)
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(monkeypatch, capsys, ["models"])
    assert code == 0, err
    for name, (shown, data) in table.items():
        (row,) = [line for line in out.splitlines()
                  if re.search(rf"│ {re.escape(name)} +│", line)]
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        millions = float(cells[1].removesuffix(" M"))
        assert _round_like(round(millions * 1e6), shown) == shown, (name, cells[1], shown)
        assert cells[3] == MODELS[name].data and cells[3] in data, (name, cells[3], data)


def test_the_models_are_built_as_the_table_describes():
    """training.md: mlp "64-1024-1024-10 ReLU"; resnet20 "CIFAR ResNet-20 (3 stages × 3 basic
    blocks, 16/32/64 channels), 1×1 projection shortcuts"; vgg16 "configuration D with batch
    norm; max-pools that would go below 1×1 are left out"; lstm "embedding 64, 2-layer LSTM
    256, linear decoder"."""
    from gradwire.models import build_model

    mlp = build_model("mlp")
    linears = [(m.in_features, m.out_features) for m in mlp.modules() if isinstance(m, nn.Linear)]
    assert linears == [(64, 1024), (1024, 1024), (1024, 10)]
    assert sum(isinstance(m, nn.ReLU) for m in mlp.modules()) == 2

    resnet = build_model("resnet20")
    convs = [m for m in resnet.modules() if isinstance(m, nn.Conv2d)]
    three = [c for c in convs if c.kernel_size == (3, 3)]
    ones = [c for c in convs if c.kernel_size == (1, 1)]
    assert len(three) == 1 + 3 * 3 * 2  # the stem, then 3 stages of 3 blocks of 2
    assert [c.out_channels for c in three[1:]] == [16] * 6 + [32] * 6 + [64] * 6
    assert [(c.in_channels, c.out_channels) for c in ones] == [(16, 32), (32, 64)]

    vgg = build_model("vgg16")
    kinds = [type(m).__name__ for m in vgg.modules()]
    assert kinds.count("Conv2d") == 13 and kinds.count("BatchNorm2d") == 13
    assert kinds.count("MaxPool2d") == 3  # 8 -> 4 -> 2 -> 1: D's other two would go below 1×1
    assert vgg.eval()(torch.rand(2, 1, 8, 8)).shape == (2, 10)

    lstm = build_model("lstm", 0, 96)
    (embed,) = [m for m in lstm.modules() if isinstance(m, nn.Embedding)]
    (rnn,) = [m for m in lstm.modules() if isinstance(m, nn.LSTM)]
    decoders = [m for m in lstm.modules() if isinstance(m, nn.Linear)]
    assert embed.embedding_dim == 64 and (rnn.num_layers, rnn.hidden_size) == (2, 256)
    assert [(d.in_features, d.out_features) for d in decoders] == [(256, 96)]


def test_digits_are_1797_images_in_0_1_with_a_fifth_held_out_by_the_seed():
    """training.md: "**digits**: scikit-learn's 1797 8×8 images ...; pixels in [0, 1]; a fixed
    permutation of `--seed` holds out 20 % for testing"."""
    from gradwire.data import digits

    train, test = digits(0)
    assert len(train) + len(test) == 1797 and len(test) == int(1797 * 0.2)
    for split in (train, test):
        assert split.x.shape[1:] == (64,)
        assert float(split.x.min()) == 0.0 and float(split.x.max()) == 1.0
    again, other = digits(0)[1], digits(1)[1]
    assert torch.equal(again.x, test.x) and not torch.equal(other.x, test.x)


def test_text_is_the_first_512_kib_of_the_standard_library_split_by_position():
    """training.md: "**text**: the first 512 KiB of the Python standard library's own `.py`
    files (the directory `sysconfig.get_paths()["stdlib"]`, top-level modules first, names
    sorted ...). The vocabulary is the byte values that occur (96 on CPython 3.11); the first
    90 % by position trains, the rest tests; samples are non-overlapping windows of `--seq-len`
    symbols with the next symbol as label at every position"."""
    from gradwire.data import stdlib_source
    from gradwire.models import get_spec
    from gradwire.models.task import load_task

    task = load_task(get_spec("lstm"), 0, seq_len=64)
    raw = stdlib_source(512 * 1024)
    assert len(raw) == 512 * 1024
    root = Path(sysconfig.get_paths()["stdlib"])
    first = sorted(p.name for p in root.iterdir() if p.suffix == ".py" and p.is_file())[0]
    head = (root / first).read_bytes()[:1000]
    assert raw.startswith(head), first
    assert task.classes == len(set(raw))
    if sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11):
        assert task.classes == 96
    cut = int(len(raw) * 0.9)
    assert len(task.train) == (cut - 1) // 64 and len(task.test) == (len(raw) - cut - 1) // 64
    assert task.train.x.shape[1] == 64 and torch.equal(task.train.x[:, 1:],
                                                      task.train.y[:, :-1])


def test_an_epoch_deals_one_permutation_round_robin_and_drops_the_tail():
    """training.md: "Each epoch deals one permutation of the training set (drawn from `--seed`
    and the epoch) round-robin to the ranks; the tail that does not divide is dropped so every
    rank runs the same number of iterations"."""
    from gradwire.data import shard_indices

    n, world = 103, 4
    for epoch, seed in ((0, 0), (3, 7)):
        perm = shard_indices(n, 0, 1, epoch, seed)  # one rank: the permutation itself
        assert sorted(perm.tolist()) == list(range(n))
        for rank in range(world):
            got = shard_indices(n, rank, world, epoch, seed)
            assert got.tolist() == perm[rank::world][: n // world].tolist(), (epoch, rank)
    assert not torch.equal(shard_indices(n, 0, 1, 0, 0), shard_indices(n, 0, 1, 1, 0))
    assert not torch.equal(shard_indices(n, 0, 1, 0, 0), shard_indices(n, 0, 1, 0, 1))


# ---- training.md, What the table shows

def _result(**over) -> dict:
    r = {"agg": "dense", "density": 0.001, "density_per_epoch": [1.0, 1.0], "model": "lstm",
         "data": "text", "parameters": 1000, "world_size": 2, "samples_per_s": 100.0,
         "wire_tx_bytes_per_iter_per_rank": None, "payload_bytes_per_iter_per_rank": 4000,
         "wall_s": 1.0, "loss": [2.0, 1.5], "test_loss": [2.0, 1.25],
         "test_accuracy": [0.3, 0.4], "epoch_wall_s": [0.5, 1.0],
         "seconds_per_iter": dict.fromkeys(("compute", "compress", "communicate", "step"),
                                           0.01)}
    return r | over


def _cells(table) -> dict[str, list[str]]:
    return {str(c.header).replace("\n", " "): [str(x) for x in c.cells] for c in table.columns}


def test_text_rows_show_perplexity_and_loopback_wire_bytes_show_n_a():
    """training.md: "test ppl (perplexity) for text models only", "exp(test loss in nats per
    symbol)"; wire MB/iter is "`n/a` on loopback, where ranks share `lo`"."""
    from gradwire.report import results_table

    cols = _cells(results_table([_result()], "t"))
    assert cols["test ppl"] == [f"{math.exp(1.25):.3f}"]
    assert cols["wire MB/iter"] == ["n/a"]
    digits = _cells(results_table([_result(model="mlp", data="digits",
                                           wire_tx_bytes_per_iter_per_rank=5e6)], "t"))
    assert "test ppl" not in digits and digits["wire MB/iter"] == ["5.000"]


def test_the_figure_plots_accuracy_and_loss_against_epoch_and_wall_time(monkeypatch,
                                                                         tmp_path):
    """training.md: "The figure (`--plot`) shows test accuracy and training loss against epoch
    and against training wall time"."""
    import gradwire.report

    drawn = []
    monkeypatch.setattr(gradwire.report, "save_figure",
                        lambda fig, path, dpi: drawn.append(fig))
    r = _result(model="mlp", data="digits", epoch_wall_s=[0.7, 1.9])
    gradwire.report.plot_curves([r], tmp_path / "f.png", "t")
    (fig,) = drawn
    axes = fig.axes
    assert len(axes) == 4
    (acc_epoch, acc_wall, loss_epoch, loss_wall) = axes
    for ax, xs, ys in ((acc_epoch, [1, 2], [30.0, 40.0]), (acc_wall, [0.7, 1.9], [30.0, 40.0]),
                       (loss_epoch, [1, 2], [2.0, 1.5]), (loss_wall, [0.7, 1.9], [2.0, 1.5])):
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == xs and list(line.get_ydata()) == ys
    assert loss_epoch.get_xlabel() == "epoch" and "wall time" in loss_wall.get_xlabel()
    assert "accuracy" in acc_epoch.get_ylabel() and "loss" in loss_epoch.get_ylabel()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_steady_epochs_are_those_at_the_final_density_and_overall_covers_every_epoch():
    """training.md: figures are "averaged ... over the *steady* epochs: those at the final
    density (... after the warm-up for those that do ...), less the first epoch of each
    process ... when others remain"; "`wall s` and the JSON's `samples_per_s_overall` cover
    every epoch, warm-up included"; samples/s is "iterations × batch × ranks / training wall
    time of the steady epochs"."""
    import argparse

    from gradwire.train import worker

    seconds = [4.0, 3.0, 2.5, 2.0, 1.5, 1.0, 1.0]
    density = [0.25, 0.0725, 0.015, 0.004, 0.001, 0.001, 0.001]
    n = len(seconds)
    history = {k: [0.0] * n for k in (*worker.SUMMED, "train_loss", "test_loss",
                                      "test_accuracy")}
    history |= {"seconds": seconds, "iterations": [10] * n, "density": density,
                worker.STARTED: [1.0] + [0.0] * (n - 1)}
    out = worker.summarize(argparse.Namespace(batch_size=4), {"world_size": 2},
                           nn.Linear(2, 1), SimpleNamespace(kind="digits"), history)
    assert out["steady_epochs"] == 3
    assert out["samples_per_s"] == pytest.approx(3 * 10 * 4 * 2 / 3.5)
    assert out["samples_per_s_overall"] == pytest.approx(n * 10 * 4 * 2 / sum(seconds))
    assert out["wall_s"] == pytest.approx(sum(seconds))
    assert out["epoch_wall_s"] == pytest.approx([sum(seconds[: i + 1]) for i in range(n)])
    assert out["density_per_epoch"] == density


# ---- training.md: the demo

class _Cluster:
    label = "fake"

    def __init__(self, hosts: int) -> None:
        self.hosts = [None] * hosts


def _demo(monkeypatch, capsys, args: list[str]) -> tuple[int, str, dict]:
    """`gradwire demo ARGS` up to its runs: what the cluster and run_demo were given."""
    import gradwire.cli.train
    import gradwire.demo

    seen: dict = {}

    @contextlib.contextmanager
    def cluster(hosts, bandwidth, loopback, mtu, progress=None):
        seen["cluster"] = (hosts, bandwidth)
        yield _Cluster(hosts)

    def run_demo(c, aggs, base, timeout, console, plot, keep=None):
        seen.update(aggs=aggs, base=base, plot=plot)

    monkeypatch.setattr(gradwire.cli.train, "ephemeral_cluster", cluster)
    monkeypatch.setattr(gradwire.demo, "run_demo", run_demo)
    code, _, err = run_cli(monkeypatch, capsys, ["demo", *args])
    return code, err, seen


def test_the_demo_left_alone_runs_its_documented_settings(monkeypatch, capsys, tmp_path):
    """training.md: "The demo's settings ...: the digits MLP, density 0.001 with the paper's
    warm-up, `--mode model`, 20 epochs, batch 8 per rank, lr 0.02, momentum 0.9, seed 0, on 4
    emulated hosts at 1 Gbit/s. The figure goes to `gradwire-demo.png` in the current folder
    unless `--plot` names another file"; "`gradwire demo` # dense vs topk vs gtopk"."""
    from gradwire.train.job import TrainConfig

    monkeypatch.chdir(tmp_path)
    code, err, seen = _demo(monkeypatch, capsys, [])
    assert code == 0, err
    assert seen["cluster"] == (4, "1gbit")
    assert seen["aggs"] == ["dense", "topk", "gtopk"]
    assert seen["base"] == TrainConfig(model="mlp", density=0.001, warmup=True, mode="model",
                                       epochs=20, batch_size=8, lr=0.02, momentum=0.9, seed=0)
    assert Path(seen["plot"]).resolve() == tmp_path / "gradwire-demo.png"


def test_a_demo_option_replaces_its_setting_and_momentum_and_warmup_stay_fixed(
        monkeypatch, capsys, tmp_path):
    """training.md: "The demo's settings, which any option `gradwire demo` takes replaces
    (momentum and the warm-up are fixed)"."""
    from gradwire.demo import DEMO

    png = tmp_path / "mine.png"
    code, err, seen = _demo(monkeypatch, capsys, [
        "--epochs", "3", "--model", "mlp-small", "--density", "0.01", "--mode", "bucket",
        "--batch-size", "16", "--lr", "0.1", "--seed", "5", "--hosts", "2", "--bandwidth",
        "100mbit", "--agg", "dense,topk", "--plot", str(png)])
    assert code == 0, err
    assert seen["cluster"] == (2, "100mbit") and seen["aggs"] == ["dense", "topk"]
    assert seen["base"] == dataclasses.replace(DEMO, epochs=3, model="mlp-small", density=0.01,
                                               mode="bucket", batch_size=16, lr=0.1, seed=5)
    assert seen["base"].momentum == 0.9 and seen["base"].warmup is True
    assert Path(seen["plot"]) == png
    for fixed in (["--momentum", "0.5"], ["--no-warmup"], ["--warmup"]):
        code, err = cli_error(monkeypatch, capsys, "demo", *fixed)
        one_line_cli_error(code, err, f"No such option: {fixed[0]}")


# ---- training.md, Errors

def test_the_documented_error_lines_are_the_clis_word_for_word(monkeypatch, capsys, no_cluster):
    """training.md, Errors: "Every bad setting is refused before a cluster is built, on one
    line, with exit status 2", with the two examples the page shows verbatim."""
    text = TRAINING.read_text().split("## Errors", 1)[1]
    block = text.split("```text", 1)[1].split("```", 1)[0]
    pairs = re.findall(r"^\$ gradwire (.+)\n(gradwire: error: .+)$", block, re.M)
    assert len(pairs) == 2
    for command, line in pairs:
        code, err = cli_error(monkeypatch, capsys, *command.split())
        assert code == 2 and err.strip() == line, (command, err)


# ---- reliability.md, In the hooks: headers until the ranks agree

class _Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _headers_per_step(method: str, steps: int, **options) -> list[tuple[int, int]]:
    """(header exchanges, aggregations) of each of ``steps`` steps of a hook on a model that
    DDP keeps in several buckets once it has rebuilt them (after the first step)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP's notes on a world of one
        ddp = DDP(_Layers(), bucket_cap_mb=0.01)
    state = gh.make(method, density=0.1, **options)
    state.register(ddp)
    out = []
    for _ in range(steps):
        headers = state._comm.headers if state._comm is not None else 0
        buckets = state.stats["buckets"]
        ddp.zero_grad()
        ddp(torch.randn(8, 64)).square().mean().backward()
        out.append((state._comm.headers - headers, state.stats["buckets"] - buckets))
    return out


@pytest.mark.parametrize("method", [m for m in gh.METHODS if m not in STATUS_IN_HEADER])
def test_a_hook_exchanges_headers_until_its_buckets_agree(one_rank, method):
    """reliability.md: "Every bucket of a DDP hook's first step exchanges a header before its
    data ... Once a step has agreed on its buckets, a later bucket that matches that list ...
    exchanges nothing ... One that does not — every bucket of the step after DDP rebuilds its
    buckets ... — exchanges its own header"; the hook's `header` stat "reports the seconds
    spent in them"."""
    per_step = _headers_per_step(method, 5)
    first, rebuilt, *steady = per_step
    assert first[0] == first[1] >= 1 and rebuilt[0] == rebuilt[1] >= 2, per_step
    assert [h for h, _ in steady] == [0, 0, 0], per_step


@pytest.mark.parametrize("method", STATUS_IN_HEADER)
def test_methods_that_agree_on_the_nan_status_first_exchange_a_header_per_bucket(one_rank,
                                                                                  method):
    """reliability.md: "The exception: methods that agree on the NaN/Inf status before
    compressing (qsgd, terngrad, signsgd, efsignsgd, dgc, random-k; below) exchange a header
    per bucket, with the status"."""
    per_step = _headers_per_step(method, 4)
    assert all(h == n >= 1 for h, n in per_step), per_step


@pytest.mark.parametrize("method", ["topk", "gtopk", "randomk", "dgc"])
def test_a_density_warmup_adds_one_header_a_step(one_rank, method):
    """reliability.md: "With a density warm-up (`warmup=`) ... the hook also exchanges one
    header per step, before its first bucket, naming the density and the previous step's
    buckets"."""
    per_step = _headers_per_step(method, 5, warmup=True, steps_per_epoch=2)
    per_bucket = method in STATUS_IN_HEADER
    for step, (h, n) in enumerate(per_step):
        if step == 0:
            assert h == n, per_step  # no step before it: its buckets' own headers
        elif step == 1:
            assert h == n + 1, per_step  # rebuilt buckets: their own, and the step's
        else:
            assert h == (n if per_bucket else 0) + 1, per_step


@pytest.mark.parametrize("method", ["dense", "topk", "qsgd"])
def test_gradwire_check_calls_0_turns_the_headers_off(one_rank, monkeypatch, method):
    """reliability.md: "It is on by default; turn it off with `GRADWIRE_CHECK_CALLS=0`"."""
    monkeypatch.setenv("GRADWIRE_CHECK_CALLS", "0")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ddp = DDP(_Layers(), bucket_cap_mb=0.01)
    state = gh.make(method, density=0.1)
    state.register(ddp)
    for _ in range(3):
        ddp.zero_grad()
        ddp(torch.randn(8, 64)).square().mean().backward()
    assert state._comm.headers == 0 and state.stats["header"] == 0
    assert state.stats["steps"] == 3


# ---- reliability.md: gradwire run stops every rank once one fails

_RANKS = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
d, r = Path(os.environ["GW_TEST_DIR"]), int(os.environ["RANK"])
if r == 0:  # fails once the others are ready
    end = time.monotonic() + 60
    while not ((d / "1").exists() and (d / "2").exists()) and time.monotonic() < end:
        time.sleep(0.02)
    print("FAILING", flush=True)
    sys.exit(3)
if r == 1:  # stops itself, as a stalled rank; its SIGTERM handler leaves a mark
    def term(*_):
        (d / "continued").write_text("")
        os._exit(0)
    signal.signal(signal.SIGTERM, term)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(f"PID {child.pid}", flush=True)
    (d / "1").write_text("")
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(120)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 2: only SIGKILL ends it
print(f"PID {os.getpid()}", flush=True)
(d / "2").write_text("")
time.sleep(120)
"""


def test_a_failed_rank_stops_the_others_with_sigterm_sigcont_then_sigkill_to_each_group(
        tmp_path):
    """reliability.md: "**`gradwire run`** stops every rank once one fails (SIGTERM and SIGCONT,
    then SIGKILL after 3 s, to each rank's whole process group) and exits non-zero with one
    line"; "a rank that fails in any other way stops the others at once"."""
    from gradwire.cluster import loopback_cluster
    from gradwire.launcher import launch

    lines, failed_at = [], []

    def sink(line: str) -> None:
        lines.append(line)
        if line.endswith("FAILING"):
            failed_at.append(time.monotonic())

    res = launch(loopback_cluster(3), [sys.executable, "-c", _RANKS], timeout=90, sink=sink,
                 extra_env={"GW_TEST_DIR": str(tmp_path)})
    ended = time.monotonic()
    assert res.returncode != 0 and "\n" not in res.message
    assert res.message == ("rank 0 exited with status 3 (its last line: FAILING); stopped the "
                           "other ranks"), res.message
    # the stopped rank was continued, so it acted on its SIGTERM (not the SIGKILL)
    assert (tmp_path / "continued").exists()
    # rank 2 ignored SIGTERM: it took the SIGKILL, 3 s on
    assert 2.9 <= ended - failed_at[0] < 20, ended - failed_at[0]
    pids = pids_in(lines)  # rank 1's child, in its process group; rank 2
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]


# ---- reliability.md, Security: nothing gradwire reads is unpickled

class _Mark:
    """Unpickled, it would create the file ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_holding_pickled_code_is_refused_without_running_it(tmp_path, monkeypatch,
                                                                        capsys, no_cluster):
    """reliability.md: "Nothing gradwire reads is unpickled: ... checkpoints are loaded with
    `torch.load(..., weights_only=True)`"; "checkpoints: "not a gradwire checkpoint"", on
    one line."""
    from gradwire.errors import GradwireError
    from gradwire.train import checkpoint

    mark, ck = tmp_path / "ran", tmp_path / "ck.pt"
    torch.save({"format": 1, "epoch": 1, "settings": _Mark(str(mark))}, ck)
    with pytest.raises(GradwireError, match="is not a gradwire checkpoint") as e:
        checkpoint.load(ck)
    assert "\n" not in str(e.value)
    code, err = cli_error(monkeypatch, capsys, "train", "--loopback", "--hosts", "2",
                          "--model", "mlp-small", "--epochs", "2", "--resume", "--checkpoint",
                          str(ck))
    one_line_cli_error(code, err, "is not a gradwire checkpoint")
    assert not mark.exists()
