import json

from conftest import gradwire_cli, needs_netns, run_cli


def test_demo_on_loopback_compares_methods_in_one_table_and_one_figure(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "demo.png"
    aggs = ["dense", "gtopk"]
    p = gradwire_cli("demo", "--loopback", "--hosts", "2", "--epochs", "2", "--model", "mlp-small",
                     "--agg", ",".join(aggs), "--json", str(out), "--plot", str(png),
                     columns=200)  # wide enough that no header wraps
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loopback, links not shaped" in p.stdout
    assert p.stdout.count("speed-up") == 1 and f"wrote {png}" in p.stdout  # one table
    # two epochs end inside gTop-k's warm-up: said before the run, and the row says so
    assert ("gradwire demo: gtopk's warm-up lasts 4 epochs, so 2 epochs end at density 0.0725, "
            "never 0.001: --epochs 5 or more send it") in p.stderr
    assert "gtopk ρ=0.0725 warm-up" in p.stdout
    results = json.loads(out.read_text())
    assert [r["agg"] for r in results] == aggs
    for r in results:
        assert r["network"] == "loopback, links not shaped"
        assert r["wire_tx_bytes_per_iter_per_rank"] is None
        assert r["loss"][-1] < r["loss"][0]
        assert r["test_accuracy"][-1] > 0.5
    assert png.read_bytes()[:4] == b"\x89PNG"


@needs_netns
def test_demo_on_the_emulated_cluster_measures_wire_bytes(tmp_path):
    out = tmp_path / "r.json"
    p = gradwire_cli("demo", "--hosts", "2", "--epochs", "2", "--model", "mlp-small", "--agg",
                     "dense", "--json", str(out), "--plot", str(tmp_path / "demo.png"))
    assert p.returncode == 0, p.stdout + p.stderr
    (r,) = json.loads(out.read_text())
    # TCP cubic where the kernel has it (test_cluster checks that hosts get it)
    assert r["network"] in ("emulated 2 hosts, 1gbit links, TCP cubic",
                            "emulated 2 hosts, 1gbit links")
    grad_bytes = 4 * r["parameters"]
    # A 2-rank ring sends half the gradient twice: one gradient's bytes plus headers.
    assert grad_bytes <= r["wire_tx_bytes_per_iter_per_rank"] <= 1.2 * grad_bytes


def test_the_demo_help_shows_the_demo_settings(monkeypatch, capsys):
    """The options left out keep the demo's settings: --help shows those values, not none."""
    from gradwire.demo import DEMO

    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(monkeypatch, capsys, ["demo", "--help"])
    assert code == 0
    out = " ".join(out.split())
    for option, value in (("--epochs", DEMO.epochs), ("--model", DEMO.model),
                          ("--density", DEMO.density), ("--mode", DEMO.mode),
                          ("--batch-size", DEMO.batch_size), ("--lr", DEMO.lr)):
        shown = out.split(option + " ", 1)[1].split("[default: ", 1)[1].split("]", 1)[0]
        want = f"({value:g})" if isinstance(value, float) else f"({value})"
        assert shown == want, (option, shown)


def test_a_method_given_twice_is_trained_once(monkeypatch, capsys, tmp_path):
    """`--agg dense,topk,dense` compares two methods: the third run would be the first again,
    a row against itself in the table and the figure."""
    import gradwire.demo

    ran = []
    monkeypatch.setattr(gradwire.demo, "run_demo", lambda c, aggs, *a, **k: ran.append(aggs))
    code, _, err = run_cli(monkeypatch, capsys, ["demo", "--loopback", "--hosts", "2", "--agg",
                                                 "dense, topk,dense", "--plot",
                                                 str(tmp_path / "d.png")])
    assert code == 0, err
    assert ran == [["dense", "topk"]]


def test_a_method_that_fails_costs_only_its_own_row(monkeypatch, capsys, tmp_path):
    """A run that fails (a rank dies, the timeout passes) must not lose the methods trained
    before it nor stop those after it: their rows reach the table, --json and the figure, and
    then the demo exits non-zero with one line naming the failure."""
    import gradwire.demo
    from gradwire.errors import GradwireError

    def train_on(cluster, cfg, label, timeout, console):
        if label == "topk":
            raise GradwireError("topk failed: rank 1 exited with code 1")
        return {"agg": label, "density": cfg.density, "model": "mlp-small", "parameters": 1000,
                "world_size": 2, "samples_per_s": 100.0, "wire_tx_bytes_per_iter_per_rank": None,
                "payload_bytes_per_iter_per_rank": 4000, "wall_s": 1.0, "loss": [2.0, 1.0],
                "test_accuracy": [0.5, 0.7], "epoch_wall_s": [0.5, 1.0],
                "seconds_per_iter": dict.fromkeys(("compute", "compress", "communicate",
                                                   "step"), 0.01)}

    monkeypatch.setattr(gradwire.demo, "train_on", train_on)
    out, png = tmp_path / "r.json", tmp_path / "d.png"
    code, stdout, err = run_cli(monkeypatch, capsys, [
        "demo", "--loopback", "--hosts", "2", "--agg", "dense,topk,gtopk", "--json", str(out),
        "--plot", str(png)])
    assert code == 2, stdout + err
    assert "topk failed: rank 1 exited with code 1; the other methods go on" in stdout
    assert [r["agg"] for r in json.loads(out.read_text())] == ["dense", "gtopk"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "1 of 3 methods failed (topk failed: rank 1 exited with code 1); the table and its " \
           "files hold the 2 that finished" in " ".join(err.split())
    assert "Traceback" not in err
