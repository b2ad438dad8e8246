"""Runs too large to simulate are refused before anything runs: a parameter server's flows are
counted up front (they were counted only as the engine finished them, after hours), and
`gradwire simulate` checks every mechanism, sweep point and table run before the first."""
import pytest

from gradwire.errors import GradwireError
from gradwire.sim import engine, mechanisms, ps
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.engine import Engine
from gradwire.sim.report import paper_table
from gradwire.sim.simulate import prepare


def _trace(n: int = 5) -> tr.Trace:
    return tr.synthetic("m", [4000 + i for i in range(n)], 0.01, 0.02)


def _never_run(monkeypatch):
    def ran(self, until=float("inf")):
        raise AssertionError("the engine ran a simulation that should have been refused")

    monkeypatch.setattr(Engine, "run", ran)


@pytest.mark.parametrize("name", ["ps", "multicast", "ina", "multicast+ina",
                                  "ps:sharding=even"])
def test_a_parameter_server_run_past_the_bound_is_refused_before_it_starts(monkeypatch, name):
    """`--workers 4096 --iterations 1000 --mechanism ps` on a 65-tensor trace ran for hours
    (some 5,000 flows a second) towards the 30 M bound the engine checks as flows finish."""
    _never_run(monkeypatch)
    c = SimCluster(4096, 25e9, servers=2, iterations=1000)
    with pytest.raises(GradwireError, match="this run sends more than 5,000,000"):
        mechanisms.parse(name).run(_trace(65), c, False)


def test_a_parameter_server_timeline_past_the_bound_is_refused_before_it_starts(monkeypatch):
    _never_run(monkeypatch)
    c = SimCluster(2048, 25e9, iterations=28)  # 4.6 M flows: replayable, not recordable
    with pytest.raises(GradwireError, match="a timeline holds at most 4,000,000 messages"):
        mechanisms.parse("ps").run(_trace(40), c, True)


@pytest.mark.parametrize("opts", [
    {}, {"multicast": True}, {"ina": True}, {"multicast": True, "ina": True},
    {"barrier": False}, {"sharding": "even"}, {"ina": True, "sharding": "even"}])
@pytest.mark.parametrize("servers, send_buffer", [(1, 0), (3, 0), (8, 5), (2, 10**6)])
def test_the_parameter_servers_count_is_the_flows_the_engine_replays(monkeypatch, opts, servers,
                                                                       send_buffer):
    """The count up front is exact (a piece of a byte over 8 servers, a send buffer that
    splits a message in two), so that the bound refuses no run it would have taken."""
    finished = []
    real = ps.finish

    def finish(name, ends, compute, eng, *rest):
        finished.append(eng.finished)
        return real(name, ends, compute, eng, *rest)

    monkeypatch.setattr(ps, "finish", finish)
    t = tr.synthetic("m", [1, 3, 4000, 7, 100_000, 2], 0.01, 0.02)
    c = SimCluster(4, 1e9, servers, iterations=3, send_buffer=send_buffer)
    o = ps.PSOptions(**opts)
    ps.simulate_ps(t, c, o)
    assert finished == [ps.flows(t, c, o)]


def test_a_distribution_visits_only_the_servers_that_hold_its_pieces(monkeypatch):
    """Each distribution scanned every piece once per server: 30 s of a 48 s run at 4096
    servers, and without the barrier the scan ran for every parameter aggregated."""
    sizes = []
    real = ps.distribution

    def distribution(mine, workers, o):
        sizes.append(len(mine))
        return real(mine, workers, o)

    monkeypatch.setattr(ps, "distribution", distribution)
    c = SimCluster(2, 1e9, servers=64, iterations=2)
    ps.simulate_ps(_trace(3), c, ps.PSOptions(barrier=False))
    assert sizes and min(sizes) > 0  # 3 tensors: 3 servers in use, not 64


def _file(tmp_path):
    return tr.save(_trace(), tmp_path / "t.jsonl")


@pytest.mark.parametrize("kw, where", [
    ({"mechanism": "ring,butterfly", "workers": 32}, "mechanism 'butterfly'"),
    ({"mechanism": "ring,ps", "workers": 32}, "mechanism 'ps'"),
    ({"mechanism": "ring,butterfly", "sweep": "workers=2,32"},
     "--sweep workers=32: mechanism 'butterfly'"),
    ({"mechanism": "ps", "sweep": "layers=0,200", "workers": 4},
     "--sweep layers=200: mechanism 'ps'"),
    ({"table": 6, "workers": 32}, "mechanism 'ps'"),
])
def test_simulate_refuses_a_run_too_large_before_the_first_mechanism_runs(monkeypatch,
                                                                          tmp_path, kw, where):
    """`--mechanism ps,ring+multicast --workers 4096` ran the parameter server for minutes and
    then refused the ring+multicast; a sweep ran its small points first."""
    monkeypatch.setattr(engine, "MAX_REPLAYED", 500)
    with pytest.raises(GradwireError, match=rf"^{where}: .*sends more than 500"):
        prepare([_file(tmp_path)], iterations=2, **kw)
    prepare([_file(tmp_path)], iterations=1, mechanism="ring,butterfly,ps", workers=4)


def test_simulate_refuses_a_timeline_too_large_before_the_first_mechanism_runs(monkeypatch,
                                                                             tmp_path):
    monkeypatch.setattr(engine, "MAX_RECORDED", 500)
    with pytest.raises(GradwireError, match="^mechanism 'ring': a timeline holds at most 500"):
        prepare([_file(tmp_path)], mechanism="ps:order=block,ring", workers=8,
                timeline=tmp_path / "tl.json")


def test_a_paper_table_names_the_servers_it_ran():
    """`--table 4 --servers 3` ran the parameter servers on 3 servers under a title that
    named none (the paper ran one)."""
    table, _ = paper_table(4, [_trace()], SimCluster(4, 1e9, servers=3, iterations=1))
    assert "3 server(s)" in str(table.title) and "the paper: 32 workers, 1 server" in str(
        table.title)
    table, _ = paper_table(8, [_trace()], SimCluster(4, 1e9, iterations=1))
    assert "8 server(s)" in str(table.title)


def _no_tables(monkeypatch):
    from gradwire.sim import collective

    def built(*a, **k):
        raise AssertionError("the ring's tables were built for a run that should be refused")

    monkeypatch.setattr(collective, "call_table", built)


def test_a_ring_of_too_many_steps_is_refused_before_its_tables_are_built(monkeypatch):
    """The ring's numpy path had no bound: 4096 workers and 1000 iterations of a 65-tensor
    trace (532 M steps) ran for hours."""
    _no_tables(monkeypatch)
    c = SimCluster(4096, 25e9, iterations=1000)
    with pytest.raises(GradwireError, match=r"this run has 532,350,000 steps .* more than "
                                            r"36,000,000"):
        mechanisms.parse("ring").run(_trace(65), c, False)


def _distinct(n: int) -> tr.Trace:
    return tr.synthetic("m", [4 * (100 + i) for i in range(n)], 0.01, 0.02)


def _held(t: tr.Trace, p: int, pipeline: int | None = None) -> int:
    """Transfers of the ring's tables, one per distinct bucket size, as the run builds them."""
    from gradwire.schedules import registry

    kw = {} if pipeline is None else {"pipeline": pipeline}
    return sum(len(registry.table("allreduce", "ring", p, n // 4, cached=False, itemsize=4,
                                  **kw).src) for n in {q.bytes for q in t.params})


@pytest.mark.parametrize("spec, pipeline", [("ring", None), ("ring:pipeline=2", 2)])
def test_a_ring_holding_too_many_transfers_is_refused_before_its_tables_are_built(
        monkeypatch, spec, pipeline):
    """A ring on 4096 workers over 200 tensors of distinct sizes held 268 MB of steps for
    each size and was killed for memory, without a word. The count from the ring's shape is
    the tables' exactly: at the bound the run goes on, one transfer under it is refused."""
    from gradwire.sim import collective

    t, c = _distinct(30), SimCluster(16, 25e9, iterations=1)
    held = _held(t, 16, pipeline)
    monkeypatch.setattr(collective, "MAX_RING_TRANSFERS", held)
    mechanisms.parse(spec).run(t, c, False)
    monkeypatch.setattr(collective, "MAX_RING_TRANSFERS", held - 1)
    _no_tables(monkeypatch)
    with pytest.raises(GradwireError, match="steps of 30 distinct bucket sizes hold more than"):
        mechanisms.parse(spec).run(t, c, False)


def test_simulate_refuses_a_ring_too_large_before_the_first_mechanism_runs(monkeypatch,
                                                                          tmp_path):
    from gradwire.sim import collective

    monkeypatch.setattr(collective, "MAX_RING_STEPS", 100)
    _never_run(monkeypatch)
    with pytest.raises(GradwireError, match=r"^mechanism 'ring': the ring is computed step by "
                                            r"step, about 75,000 a second, and this run has 310"):
        prepare([_file(tmp_path)], mechanism="ps,ring", workers=32, iterations=1)


# A compressed ring runs the catalogue's calls: ring calls (PowerSGD's allreduces, signSGD's
# allgather) on the ring's numpy path, top-k's allgather and gTop-k's butterfly message by
# message. `--mechanism ring:bucket=25M,ring:compress=topk --workers 2048 --iterations 20`
# simulated the first for 19 s, then refused the second.
@pytest.mark.parametrize("spec", ["ring:compress=topk:density=0.01", "ring:compress=gtopk"])
def test_simulate_refuses_a_compressed_ring_replayed_too_long_before_anything_runs(
        monkeypatch, tmp_path, spec):
    monkeypatch.setattr(engine, "MAX_REPLAYED", 500)
    _never_run(monkeypatch)
    with pytest.raises(GradwireError, match=rf"^mechanism '{spec}': .*sends more than 500"):
        prepare([_file(tmp_path)], mechanism=f"ring,{spec}", workers=32, iterations=2)


@pytest.mark.parametrize("spec", ["ring:compress=powersgd:rank=2", "ring:compress=signsgd",
                                  "ring:bucket=6000:compress=int8"])
def test_simulate_refuses_a_compressed_ring_of_too_many_steps_before_anything_runs(
        monkeypatch, tmp_path, spec):
    from gradwire.sim import collective

    monkeypatch.setattr(collective, "MAX_RING_STEPS", 100)
    _never_run(monkeypatch)
    _no_tables(monkeypatch)
    with pytest.raises(GradwireError, match=rf"^mechanism '{spec}': the ring is computed step "
                                            r"by step"):
        prepare([_file(tmp_path)], mechanism=f"ps,{spec}", workers=32, iterations=1)


def _compressed_shape(spec: str, t: tr.Trace, c: SimCluster) -> tuple[int, int]:
    """(steps, transfers) a compressed ring's run computes, from the tables it builds."""
    from gradwire.schedules.ir import Table
    from gradwire.sim import collective
    from gradwire.sim.replay import step_arrays

    o = mechanisms.parse(spec).options
    specs = collective._bucket_specs(t, collective.buckets(t, o.bucket_bytes), c.workers, o)
    steps, held = 0, {}
    for calls, item in specs:
        table = Table.chain([collective.call_table(x, c.workers, item, cached=False)
                             for x in calls])
        held[repr((calls, item))] = len(table.src)
        steps += len(step_arrays(table, item))
    return steps * c.iterations, sum(held.values())


@pytest.mark.parametrize("spec, workers", [
    ("ring:compress=powersgd:rank=2", 7), ("ring:compress=signsgd", 16),
    ("ring:compress=randomk:density=0.5", 5), ("ring:bucket=9000:compress=qsgd", 8),
    ("ring:compress=topk:density=0.1", 2), ("ring:compress=gtopk", 2)])
def test_a_compressed_rings_count_up_front_is_what_its_run_computes(monkeypatch, spec,
                                                                      workers):
    """The steps and transfers counted before the run are its tables' exactly: at each bound
    the check passes and the run goes on, one under it the check refuses."""
    from gradwire.sim import collective

    t = tr.synthetic("m", [4 * n for n in (100, 3000, 17, 3000, 64)], 0.01, 0.02,
                     shapes=[(10, 10), (30, 100), None, (3000,), (8, 8)])
    c = SimCluster(workers, 25e9, iterations=2)
    m = mechanisms.parse(spec)
    steps, held = _compressed_shape(spec, t, c)
    monkeypatch.setattr(collective, "MAX_RING_STEPS", steps)
    monkeypatch.setattr(collective, "MAX_RING_TRANSFERS", held)
    mechanisms.check(t, c, [m])
    m.run(t, c, False)
    for name, bound, said in (("MAX_RING_STEPS", steps, "computed step by step"),
                              ("MAX_RING_TRANSFERS", held, "distinct bucket sizes hold")):
        monkeypatch.setattr(collective, name, bound - 1)
        with pytest.raises(GradwireError, match=said):
            mechanisms.check(t, c, [m])
        monkeypatch.setattr(collective, name, bound)
