import importlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from gradwire.cluster import netns_available

# Property tests are judged by their examples, not their time: on a loaded CI machine (tests in
# two workers, ranks on two cores) hypothesis' default 200 ms deadline failed sound examples.
settings.register_profile("gradwire", deadline=None)
settings.load_profile("gradwire")


def pytest_configure(config):
    """Stop signals as a terminal gives them, whatever started the tests: a background job of
    a shell (``cmd &``) starts with SIGINT and SIGQUIT ignored, nohup with SIGHUP too, and the
    processes the tests start inherit that. Tests of what Ctrl-C does then saw nothing."""
    import signal

    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)


SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
BENCHMARKS = ROOT / "benchmarks"
BENCH_RANKS = BENCHMARKS / "ranks"
_ok, _why = netns_available()
needs_netns = pytest.mark.skipif(not _ok, reason=_why or "network namespaces unavailable")


@pytest.fixture
def one_rank(tmp_path):
    """A world of one gloo rank in this process (a rank's side without a launcher)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


# What every rank of run_world imports before its checks run: torch, and torch._dynamo, which
# DDP's constructor imports. A server process imports them once and forks each rank from
# there; a spawned rank spent about 3 s of CPU on them, 24 s at P = 8.
RANK_IMPORTS = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel"]


def run_world(checks, world: int, out: Path, *args: object) -> list[dict]:
    """What ``checks(rank, world, *args)`` returned (a JSON-able dict) on each of ``world``
    new gloo ranks, in rank order. ``checks`` is a module-level function of a test module
    (the ranks import it); ``out``, a folder, keeps each rank's answer. The ranks have this
    process's environment, not that of the test that started the server they fork from.
    Every send or receive waits at most 20 s (GRADWIRE_TIMEOUT), the process group 30 s."""
    import multiprocessing

    import torch.multiprocessing as mp

    from gradwire.launcher import free_port

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_IMPORTS)
    url = f"tcp://127.0.0.1:{free_port()}"
    mp.start_processes(_world_rank, args=(checks, world, url, str(out), args, dict(os.environ)),
                       nprocs=world, start_method="forkserver")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _world_rank(rank: int, checks, world: int, url: str, out: str, args: tuple,
                env: dict[str, str]) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.clear()
    os.environ.update(env, GRADWIRE_TIMEOUT="20")
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    seen = checks(rank, world, *args)
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def quick_resnet20(folder: Path) -> Path:
    """resnet20's profile with a 5 ms backward, as a file for `calibrate --model`: calibrate
    sizes the batch of its compute stand-in to the profile's backward time (60 ms where the
    profile has none, as resnet20's) and times 120 iterations of it alone and as many under
    DDP, most of a calibration on CPU ranks."""
    from gradwire import profiles

    path = folder / "resnet20-5ms.json"
    path.write_text(profiles.load("resnet20").with_compute(0.0025, 0.005, "tests").to_text())
    return path


@pytest.fixture
def no_cluster(monkeypatch):
    """For `gradwire train` refusals: a run that gets as far as its cluster fails the test
    (the refusal came too late)."""
    import gradwire.cli.train

    def started(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(gradwire.cli.train, "ephemeral_cluster", started)


def cli_error(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """Run ``gradwire ARGS`` in this process; (exit code, stderr). For inputs that must fail."""
    from gradwire import cli

    monkeypatch.setattr(sys, "argv", ["gradwire", *args])
    with pytest.raises(SystemExit) as e:
        cli.main()
    return e.value.code, capsys.readouterr().err


def run_cli(monkeypatch, capsys, args: list[str], started: tuple[type[BaseException], ...] = ()
            ) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``gradwire ARGS`` in this process; 0 where it returns or
    raises one of ``started`` (where a test has made the real work start with an exception)."""
    from gradwire import cli

    monkeypatch.setattr(sys, "argv", ["gradwire", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except started:
        code = 0
    out, err = capsys.readouterr()
    return code, out, err


class Started(Exception):
    """Raised where a command's real work would start: its checks all passed."""


def start_here(monkeypatch, module: str, attr: str) -> None:
    """Make ``module.attr`` (where a command's real work starts) raise :class:`Started`."""
    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(importlib.import_module(module), attr, started)


def one_line_raised(fn, *needles: str) -> str:
    """``fn()`` raises a GradwireError of one line holding every one of ``needles``; its text."""
    from gradwire.errors import GradwireError

    with pytest.raises(GradwireError) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text, text
    for n in needles:
        assert n in text, text
    return text


def one_line_cli_error(code: int, err: str, *needles: str) -> None:
    """``gradwire`` refused its input: exit 2 and one ``gradwire: error:`` line holding each
    of ``needles``."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gradwire: error: "), (code, err)
    for needle in needles:
        assert needle in lines[0], err


def gradwire_cli(*args: str, env: dict | None = None, timeout: float = 600,
                 columns: int | None = None) -> subprocess.CompletedProcess:
    """``gradwire ARGS`` in a new process, its output captured as text; ``env`` adds to this
    process's environment, ``columns`` sets the width rich lays tables out to."""
    extra = {**(env or {}), **({"COLUMNS": str(columns)} if columns else {})}
    return subprocess.run([sys.executable, "-m", "gradwire.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **extra})


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is no zombie (one its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pids_in(lines: list[str]) -> list[int]:
    """The process ids that ranks printed as ``PID n`` lines (behind the launcher's prefix)."""
    return [int(m.group(1)) for line in lines if (m := re.search(r"\bPID (\d+)$", line))]


def strict_json(text: str) -> object:
    """``text`` parsed as JSON that holds no NaN or Infinity (Python's reader takes them; jq,
    JavaScript and most libraries refuse them): ValueError naming the first one found."""
    def refuse(token: str) -> None:
        raise ValueError(f"{token} in JSON")

    return json.loads(text, parse_constant=refuse)


def script(name: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name)]


def run_checks(name: str, p: int, timeout: float) -> None:
    """Run tests/scripts/``name`` on ``p`` loopback ranks; every rank must print FAIL lines for
    what it found wrong and end with ``CHECKED ... failures=0``."""
    from gradwire.cluster import loopback_cluster
    from gradwire.launcher import launch

    lines: list[str] = []
    res = launch(loopback_cluster(p), script(name), timeout=timeout, sink=lines.append)
    fails = [x for x in lines if "FAIL" in x]
    assert not fails, "\n".join(fails[:20])
    assert res.returncode == 0, "\n".join(lines[-30:])
    done = [x for x in lines if "CHECKED" in x]
    assert len(done) == p and all("failures=0" in x for x in done)


@pytest.fixture
def builds(monkeypatch) -> list[list[str]]:
    """The `ip` and `tc` commands that would build something (add a namespace, link or
    address; add or replace a qdisc) that this process runs while the test goes on;
    `netns_available`'s probe, added and deleted at once, is not one. For "bad input builds
    nothing": unlike a before/after list of the machine's namespaces, it holds while other
    runs make and remove theirs."""
    made: list[list[str]] = []
    real = subprocess.run

    def run(cmd, *args, **kwargs):
        argv = [str(a) for a in cmd] if isinstance(cmd, (list, tuple)) else [str(cmd)]
        # `ip -batch -` (and `ip -n NS -batch -`): each line of its input is a command
        batch = argv[-2:] == ["-batch", "-"] and isinstance(kwargs.get("input"), str)
        for one in ([[*argv[:-2], *line.split()] for line in kwargs["input"].splitlines()]
                    if batch else [argv]):
            probe = one[:3] == ["ip", "netns", "add"] and one[3].startswith("gwprobe")
            if one[:1] in (["ip"], ["tc"]) and {"add", "replace"} & set(one) and not probe:
                made.append(one)
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    return made


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def link_names() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def gradwire_leftovers(name: str) -> list[str]:
    """Namespaces and links that still carry the cluster's name."""
    return sorted(n for n in netns_names() | link_names() if n.startswith(name))


def host_pair(c, serve: str, send: str, timeout: float = 60) -> tuple[str, str]:
    """Run the Python code ``serve`` in host 1's namespace of cluster ``c`` until it prints
    its first line ("1": it listens), then ``send`` in host 0's; (what ``send`` printed, what
    ``serve`` printed after its first line)."""
    server = subprocess.Popen(["ip", "netns", "exec", c.hosts[1].netns, sys.executable, "-c",
                               serve], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "1"
        sent = subprocess.run(["ip", "netns", "exec", c.hosts[0].netns, sys.executable, "-c",
                               send], capture_output=True, text=True, timeout=timeout,
                              check=True).stdout
        rest, _ = server.communicate(timeout=timeout)
        return sent, rest
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def load_benchmark(name: str, monkeypatch):
    """benchmarks/<name>.py as a fresh module (its sibling imports, such as ``ab``, found)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def benchmark_argv(monkeypatch, script: str, *args: str) -> None:
    """``sys.argv`` as if benchmarks/``script`` had been run with ``args``."""
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), *args])


@pytest.fixture
def held_port():
    """A port on 127.0.0.1 that a socket of this process holds, listening: its connections
    are taken and never answered (a stopped store, another program's port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]
