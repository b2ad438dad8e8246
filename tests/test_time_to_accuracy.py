"""benchmarks/time_to_accuracy.py's pure parts: the hook names it accepts, --epochs, and how it
turns curves into seconds to target, the best of each side and the table (the run itself takes
half an hour on the emulated cluster, outside CI)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import gradwire.hooks as gh

PATH = Path(__file__).parent.parent / "benchmarks" / "time_to_accuracy.py"


@pytest.fixture(scope="module")
def tta():
    spec = importlib.util.spec_from_file_location("time_to_accuracy", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def curve(*points):
    """[(seconds, accuracy), ...] as a row's curve, 128 samples an epoch, from epoch 0."""
    return [{"epoch": e, "train_seconds": s, "samples": 128 * e, "train_loss": None,
             "test_accuracy": a, "test_loss": 1.0} for e, (s, a) in enumerate(points)]


def row(hook, points, model="mlp"):
    return {"model": model, "hook": hook, "side": hook.partition(":")[0],
            "buckets": "one" if hook.startswith("torch:powersgd") else "default",
            "curve": curve(*points)}


def test_every_method_and_pytorch_hook_is_a_default_row_and_parses(tta):
    names = tta.default_hooks()
    assert len(names) == len(set(names)) == len(gh.METHODS) + 1 + 4 + 5
    assert {f"gradwire:{m}" for m in gh.METHODS if m != "powersgd"} <= set(names)
    assert {"gradwire:topk+warmup", "gradwire:gtopk+warmup", "gradwire:topk+warmup+momentum",
            "gradwire:gtopk+warmup+momentum", "gradwire:powersgd-r4",
            "gradwire:powersgd-r1", "torch:allreduce", "torch:fp16", "torch:bf16",
            "torch:powersgd-r4", "torch:powersgd-r1"} <= set(names)
    specs = [tta.parse_hook(n, 0.001, gh.METHODS) for n in names]
    assert [s["hook"] for s in specs] == names
    assert {s["hook"] for s in specs if s["buckets"] == "one"} == {"torch:powersgd-r4",
                                                                   "torch:powersgd-r1"}


def test_hook_specs_carry_make_s_arguments(tta):
    p = lambda n: tta.parse_hook(n, 0.01, gh.METHODS)  # noqa: E731
    assert p("gradwire:topk") == {"hook": "gradwire:topk", "side": "gradwire", "method": "topk",
                                  "options": {"density": 0.01}, "warmup": False,
                                  "momentum": False, "buckets": "default"}
    assert p("gradwire:gtopk+warmup")["warmup"] and p("gradwire:dgc+warmup")["warmup"]
    both = p("gradwire:gtopk+warmup+momentum")
    assert both["warmup"] and both["momentum"]
    assert {**p("gradwire:gtopk+momentum+warmup"), "hook": both["hook"]} == both
    assert p("gradwire:topk+momentum")["momentum"] and not p("gradwire:topk+momentum")["warmup"]
    assert p("gradwire:qsgd")["options"] == {}  # no density for the non-sparsifiers
    assert p("gradwire:powersgd-r4")["options"] == {"rank": 4}
    assert p("torch:powersgd-r2") == {"hook": "torch:powersgd-r2", "side": "torch",
                                      "method": "powersgd", "options": {"rank": 2},
                                      "warmup": False, "momentum": False, "buckets": "one"}
    assert p("torch:allreduce")["buckets"] == "default"


@pytest.mark.parametrize("bad", ["topk", "gradwire:topq", "gradwire:powersgd",
                                 "gradwire:powersgd-r0", "gradwire:dense+warmup",
                                 "gradwire:topk+warmdown", "gradwire:dense-r4", "torch:topk",
                                 "torch:powersgd", "torch:fp16+warmup", "mpi:allreduce", "",
                                 "gradwire:topk+warmup+warmup", "gradwire:qsgd+momentum",
                                 "torch:allreduce+momentum"])
def test_an_unknown_hook_is_refused_naming_the_known_ones(tta, bad):
    with pytest.raises(ValueError, match="unknown hook .*known are .*torch:allreduce"):
        tta.parse_hook(bad, 0.001, gh.METHODS)


def test_epochs_one_for_all_or_per_model(tta):
    models = ["mlp", "lstm"]
    assert tta.parse_epochs(None, models) == {"mlp": 10, "lstm": 3}
    assert tta.parse_epochs("2", models) == {"mlp": 2, "lstm": 2}
    assert tta.parse_epochs("lstm=1", models) == {"mlp": 10, "lstm": 1}
    for bad in ("0", "x", "resnet20=2", "mlp:2", "mlp=0", "mlp=2,"):
        with pytest.raises(ValueError, match="--epochs"):
            tta.parse_epochs(bad, models)


def test_seconds_to_target_is_the_first_epoch_at_or_above_it_not_the_best(tta):
    s = tta.summarize_row(row("gradwire:dense", [(0, 0.1), (2.0, 0.5), (4.0, 0.9),
                                                 (6.0, 0.95), (8.0, 0.92)]), 0.9)
    assert s["reached"] and s["seconds_to_target"] == 4.0 and s["epoch_to_target"] == 2
    assert s["best_accuracy"] == 0.95 and s["final_accuracy"] == 0.92
    assert s["train_seconds"] == 8.0 and s["samples_per_s"] == 4 * 128 / 8.0


def test_a_row_that_misses_the_target_says_its_best(tta):
    s = tta.summarize_row(row("torch:fp16", [(0, 0.1), (1.0, 0.6), (2.0, 0.5)]), 0.9)
    assert not s["reached"] and s["seconds_to_target"] is None
    assert s["best_accuracy"] == 0.6 and s["final_accuracy"] == 0.5


def test_a_failed_row_is_not_reached_and_keeps_its_error(tta):
    s = tta.summarize_row({"model": "mlp", "hook": "torch:powersgd-r1", "error": "boom"}, 0.9)
    assert not s["reached"] and s["error"] == "boom" and s["samples_per_s"] is None


def test_each_side_s_best_is_the_fastest_to_target_and_the_ratio_is_torch_over_ours(tta):
    rows = [row("gradwire:dense", [(0, 0.1), (4.0, 0.95)]),
            row("gradwire:topk", [(0, 0.1), (1.0, 0.5), (2.0, 0.91)]),
            row("gradwire:signsgd", [(0, 0.1), (0.5, 0.1)]),  # fast, never there
            row("torch:allreduce", [(0, 0.1), (4.0, 0.95)]),
            row("torch:fp16", [(0, 0.1), (3.0, 0.92)])]
    best = tta.summarize(rows, {"mlp": 0.9})["mlp"]["best"]
    assert best == {"gradwire": "gradwire:topk", "gradwire_seconds": 2.0,
                    "torch": "torch:fp16", "torch_seconds": 3.0, "torch_over_gradwire": 1.5}


def test_a_tie_goes_to_the_higher_final_accuracy_and_no_row_reached_gives_none(tta):
    # the higher accuracy goes to the name that sorts last, so a tie broken by name would lose
    rows = [row("gradwire:bf16", [(0, 0.1), (2.0, 0.91)]),
            row("gradwire:fp16", [(0, 0.1), (2.0, 0.97)]),
            row("torch:allreduce", [(0, 0.1), (2.0, 0.5)])]
    best = tta.summarize(rows, {"mlp": 0.9})["mlp"]["best"]
    assert best["gradwire"] == "gradwire:fp16"
    assert best["torch"] is None and best["torch_over_gradwire"] is None


def doc(rows):
    return {"network": "loopback, links not shaped", "hosts": 4, "date": "today",
            "commit": "abc", "machine": "vm", "contention": "4 ranks on 2 cores",
            "targets": {"mlp": {"accuracy": 0.9, "chosen": "test"},
                        "lstm": {"accuracy": 0.4, "chosen": "test"}},
            "rows": rows}


ROWS = [row("gradwire:topk", [(0, 0.1), (1.5, 0.95)]),
        row("torch:powersgd-r1", [(0, 0.1), (1.0, 0.5)]),
        {"model": "mlp", "hook": "gradwire:dgc", "side": "gradwire", "buckets": "default",
         "error": "GradwireError: boom"},
        row("torch:allreduce", [(0, 0.0), (9.0, 0.45)], model="lstm")]


def test_the_table_has_every_row_in_words(tta):
    md = tta.markdown(doc(ROWS))
    assert "| mlp | gradwire:topk | default | 1.5 (epoch 1) | 0.950 | 85 |" in md
    assert "| mlp | torch:powersgd-r1 | one | not reached (best 0.500) | 0.500 | 128 |" in md
    assert "| mlp | gradwire:dgc | default | failed: GradwireError: boom | n/a | n/a |" in md
    assert "| mlp | 0.900 | gradwire:topk | 1.5 | none reached | n/a | n/a |" in md
    assert "| lstm | 0.400 | none reached | n/a | torch:allreduce | 9.0 | n/a |" in md


def test_render_only_rebuilds_the_plot_and_table_from_the_json(tta, tmp_path, monkeypatch):
    out = tmp_path / "tta.json"
    out.write_text(json.dumps(doc(ROWS)))
    monkeypatch.setattr(sys, "argv", [str(PATH), "--render-only", "--out", str(out)])
    tta.main()
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "gradwire:topk" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("argv, says", [
    (["--hooks", "gradwire:topq"], "unknown hook 'gradwire:topq': known are gradwire:dense"),
    (["--hooks", "torch:fp16,torch:fp16"], "names a hook twice"),
    (["--models", "vgg16"], "--models takes mlp, resnet20, lstm"),
    (["--epochs", "mlp=x"], "--epochs must be N or MODEL=N"),
    (["--density", "0"], "--density must be in (0, 1]"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--render-only", "--out", "/nonexistent/tta.json"], "needs an existing JSON"),
])
def test_bad_arguments_fail_in_one_line_before_any_cluster(tta, monkeypatch, capsys, argv, says):
    monkeypatch.setattr(sys, "argv", [str(PATH), *argv])
    monkeypatch.setattr(tta, "run", lambda *a: pytest.fail("a bad argument reached the run"))
    with pytest.raises(SystemExit) as e:
        tta.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and err.strip().count("\n") <= 1


def seeded(hook, seed, points, model="mlp"):
    return {**row(hook, points, model), "seed": seed}


def test_several_seeds_are_one_row_of_their_mean_curve(tta):
    rows = [seeded("gradwire:topk", 0, [(0, 0.1), (2.0, 0.8), (4.0, 0.96)]),
            seeded("gradwire:topk", 1, [(0, 0.1), (4.0, 0.92), (6.0, 0.94)]),
            seeded("torch:fp16", 0, [(0, 0.1), (1.0, 0.97)])]
    merged = tta.merge_seeds(rows)
    assert [r["hook"] for r in merged] == ["gradwire:topk", "torch:fp16"]
    topk = merged[0]
    assert topk["seeds"] == [0, 1] and topk["final_accuracy_each"] == [0.96, 0.94]
    assert [p["train_seconds"] for p in topk["curve"]] == [0, 3.0, 5.0]
    assert [p["test_accuracy"] for p in topk["curve"]] == pytest.approx([0.1, 0.86, 0.95])
    assert merged[1] == rows[2]  # one seed: the row as it is
    s = tta.summarize(rows, {"mlp": 0.9})["mlp"]["hooks"]["gradwire:topk"]
    # the mean curve first reaches 0.9 at epoch 2 (neither seed's own epoch alone)
    assert s["reached"] and s["epoch_to_target"] == 2 and s["seconds_to_target"] == 5.0
    assert s["final_accuracy"] == pytest.approx(0.95) and s["seeds"] == 2
    md = tta.markdown({**doc(rows), "seeds": [0, 1]})
    assert "| mlp | gradwire:topk | default | 5.0 (epoch 2) | 0.950 (0.940–0.960) |" in md
    assert "the mean of 2 seeds' curves" in md


def test_a_hook_that_failed_from_one_seed_is_that_failure(tta):
    failed = {"model": "mlp", "hook": "gradwire:dgc", "side": "gradwire", "seed": 1,
              "buckets": "default", "error": "GradwireError: boom"}
    rows = [seeded("gradwire:dgc", 0, [(0, 0.1), (1.0, 0.95)]), failed]
    assert tta.merge_seeds(rows) == [failed]
    assert tta.summarize(rows, {"mlp": 0.9})["mlp"]["hooks"]["gradwire:dgc"]["error"]


def test_each_pytorch_hook_trains_right_after_gradwire_s_counterpart(tta):
    names = tta.default_hooks()
    for ours, theirs in [("gradwire:dense", "torch:allreduce"), ("gradwire:fp16", "torch:fp16"),
                         ("gradwire:bf16", "torch:bf16"),
                         ("gradwire:powersgd-r4", "torch:powersgd-r4"),
                         ("gradwire:powersgd-r1", "torch:powersgd-r1")]:
        assert names.index(theirs) == names.index(ours) + 1
