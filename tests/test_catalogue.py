"""The aggregation catalogue is the one statement of what every method sends: the bytes a real
hook call moves over gloo (counted by the transport), the bytes the catalogue says, the bytes
the performance model prices and the link bytes the simulator moves are equal, for every
method, P in {2, 3, 5, 8} and two bucket sizes."""


import pytest
import torch
from conftest import run_world

from gradwire import catalogue
from gradwire.collectives.agree import header_spec
from gradwire.compress.quantize import INT8_BLOCK, INT8_MOVES
from gradwire.perf.model import Aggregation, bytes_sent
from gradwire.schedules import registry
from gradwire.sim import trace as tr
from gradwire.sim.cluster import SimCluster
from gradwire.sim.collective import CollectiveOptions, simulate_collective

WORLDS = (2, 3, 5, 8)
SIZES = (1000, 50_003)
DENSITY = 0.01
RANK = 2  # PowerSGD's
METHODS = tuple(catalogue.METHODS)


def _options(name: str) -> dict:
    return {"rank": RANK} if name == "powersgd" else {}


def _plan(name: str, numel: int, world: int, algo: str | None,
          shapes: tuple | None = None) -> catalogue.BucketPlan:
    m = catalogue.get(name)
    return m.plan(numel, world, torch.float32, m.make_compressor(DENSITY, **_options(name)),
                  DENSITY, algo, shapes)


def _simulated(name: str, numel: int, world: int) -> int:
    """Bytes the simulator moves over the workers' up links per iteration, one bucket."""
    t = tr.synthetic("one", [4 * numel], 0.001, 0.002, 0.0)
    c = SimCluster(world, 1e9, iterations=2)
    takes = catalogue.get(name).takes_density
    params = {"density": DENSITY, **_options(name)} if takes else _options(name)
    o = CollectiveOptions("ring", compressor=name, compressor_params=params)
    r = simulate_collective(t, c, o)
    return round(r.link_bytes["worker up"] / c.iterations)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", METHODS)
def test_catalogue_model_and_simulator_move_the_same_bytes(name, world):
    for numel in SIZES:
        plan = _plan(name, numel, world, "ring")
        ours = plan.bytes_sent(world)
        agg = Aggregation(name, density=DENSITY, rank=RANK)
        assert bytes_sent(agg, numel, world).tolist() == ours.tolist(), (name, numel)
        # a bucket of real tensors: PowerSGD sends a factor pair per matrix, not one
        shaped = _plan(name, numel, world, "ring", _shapes(numel)).bytes_sent(world)
        assert bytes_sent(agg, numel, world, shapes=_shapes(numel)).tolist() == \
            shaped.tolist(), (name, numel)
        assert _simulated(name, numel, world) == int(ours.sum()), (name, numel)
        # the hooks' default (torch.distributed's collectives) is priced on the same calls
        default = _plan(name, numel, world, None)
        assert [(c.collective, c.count, c.itemsize) for c in default.calls] == [
            (c.collective, c.count, c.itemsize) for c in plan.calls]


def test_powersgd_is_two_allreduces_everywhere():
    plan = _plan("powersgd", 50_003, 4, "ring")
    assert [(c.collective, c.what) for c in plan.calls] == [("allreduce", "P"),
                                                            ("allreduce", "Q")]
    assert plan.sent == (224 + 224) * RANK * 4 + 4  # P, Q and the status element beside P
    sent = [int(registry.table("allreduce", "ring", 4, n).size.sum()) * 4
            for n in (224 * RANK + 1, 224 * RANK)]
    assert _simulated("powersgd", 50_003, 4) == sum(sent)


def test_int8_is_one_allreduce_of_a_byte_per_element_and_the_votes():
    plan = _plan("int8", 50_003, 4, "ring")
    wire = 50_003 + len(INT8_MOVES) * -(-50_003 // INT8_BLOCK) + 2  # levels, votes, status
    assert [(c.collective, c.what, c.count, c.itemsize, c.dtype) for c in plan.calls] == [
        ("allreduce", "payload", wire, 1, torch.int8)]
    assert plan.sent == wire
    assert _simulated("int8", 50_003, 4) == int(registry.table("allreduce", "ring", 4,
                                                               wire).size.sum())
    assert _plan("int8", 2, 4, "ring").dense  # 2 + 8 + 2 bytes are no fewer than 8


def test_compressor_semantics_live_on_the_compressor():
    m = catalogue.METHODS
    assert [n for n in m if m[n].error_feedback] == ["topk", "gtopk", "randomk", "dgc",
                                                     "efsignsgd", "int8", "powersgd"]
    assert [n for n in m if m[n].takes_density] == ["topk", "gtopk", "randomk", "dgc"]
    assert [n for n in m if m[n].per_rank_seed] == ["qsgd", "terngrad"]
    # a density that keeps everything sends the bucket dense (4n, not 8n of pairs)
    assert catalogue.get("topk").plan(100, 4, density=1.0).dense


@pytest.mark.parametrize(("name", "dtype", "density", "dense"), [
    ("topk", torch.float32, 0.5, True),  # 50 pairs of 8 bytes: 400, the bucket's size
    ("topk", torch.float32, 0.49, False),
    ("gtopk", torch.float16, 0.34, True),  # 34 pairs of 6 bytes: 204 against 200
    ("gtopk", torch.float16, 0.33, False),
    ("dgc", torch.float32, 0.6, True),
])
def test_a_sparse_payload_no_smaller_than_the_bucket_goes_dense(name, dtype, density, dense):
    """Pairs cost value and index: at density 0.5 of an fp32 bucket Top-k sent as many bytes
    as the bucket (and more above it) while dropping half of it into the residual; the
    plan went dense only at k = n. Now it goes dense wherever the pairs are no smaller."""
    plan = catalogue.get(name).plan(100, 4, dtype, density=density)
    assert plan.dense is dense
    assert plan.sent <= 100 * dtype.itemsize


def test_a_one_element_scaled_sign_goes_dense():
    """EF-signSGD of one element sent its packed sign and a 4-byte scale, QSGD its level and
    norm: more than the fp32 element itself."""
    for name in ("efsignsgd", "qsgd", "terngrad"):
        assert catalogue.get(name).plan(1, 4).dense
        assert not catalogue.get(name).plan(1000, 4).dense


# ------------------------------------------------------------------ real hooks over gloo
# A linear layer of each size in SIZES: its weight (a matrix PowerSGD compresses) and bias
# (which it sends as it is).
LINEAR = {1000: (24, 40), 50_003: (1612, 31)}


def _shapes(numel: int) -> tuple:
    cin, cout = LINEAR[numel]
    return ((cout,), (cout, cin))


def _rank(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    import gradwire.hooks as gh

    torch.set_num_threads(1)
    counted = {}
    for name in METHODS:
        for numel in SIZES:
            torch.manual_seed(rank)
            cin, cout = LINEAR[numel]
            net = torch.nn.Linear(cin, cout)
            ddp = DistributedDataParallel(net)
            state = gh.make(name, density=DENSITY, warmup=False, algo="ring", **_options(name))
            state.register(ddp)
            ddp(torch.randn(3, cin)).sum().backward()
            comm = state._comm  # noqa: SLF001 - the transports the hook's calls went through
            header = comm.transport.control_bytes_sent
            counted[f"{name} {numel} first"] = sum(comm.agreed.bytes_sent)
            # the steady state, a third step: int8's first step of a bucket (and the first
            # after DDP rebuilt its buckets) agrees on the bucket's step sizes first
            ddp(torch.randn(3, cin)).sum().backward()
            before = sum(comm.agreed.bytes_sent)
            ddp(torch.randn(3, cin)).sum().backward()
            counted[f"{name} {numel}"] = (sum(comm.agreed.bytes_sent) - before, header)
    return counted


@pytest.mark.parametrize("world", WORLDS)
def test_a_real_hook_call_moves_what_the_catalogue_says(world, tmp_path):
    counted = run_world(_rank, world, tmp_path)
    coll, algo, count, params = header_spec(world)
    header = registry.table(coll, algo, world, count, **params)
    header_bytes = header.sent()
    for name in METHODS:
        for numel in SIZES:
            want = _plan(name, numel, world, "ring", _shapes(numel)).bytes_sent(world)
            got = [counted[r][f"{name} {numel}"] for r in range(world)]
            assert [g[0] for g in got] == want.tolist(), (name, numel)
            assert [g[1] for g in got] == header_bytes.tolist(), (name, numel)
            if name == "int8":  # its first step agrees on the maxima first: 4 bytes a block
                head = registry.table("allreduce", "ring", world,
                                      -(-numel // INT8_BLOCK) + 1).sent() * 4
                first = [counted[r][f"{name} {numel} first"] for r in range(world)]
                assert first == (want + head).tolist(), (numel, first)
