"""The collectives' API behaves as c10d's does, on every rank: calls in flight at once on
one group (async, or async then plain) run in the order they were issued; roots are global
ranks under a subgroup; a rank outside the subgroup does nothing; a parameter that requires
grad is written in place; ``wait`` takes a timedelta. Prints FAIL lines and a CHECKED line."""
import datetime

import torch
import torch.distributed as dist
from checklist import DEV, check, done, init

import gradwire.collectives as gc

rank, p = init()
assert p >= 3, "needs 3 ranks or more"

# calls in flight at once, of different sizes, and a plain call before their wait
for algo in ("ring", "rd", None):
    a = torch.full((1000,), rank + 1.0, device=DEV)
    b = torch.full((37,), 10.0 * (rank + 1), device=DEV)
    c = torch.full((5,), 100.0 * (rank + 1), device=DEV)
    h1 = gc.all_reduce(a, algo=algo, async_op=True)
    h2 = gc.all_reduce(b, algo=algo, async_op=True)
    gc.all_reduce(c, algo=algo)
    h2.wait(datetime.timedelta(seconds=60))
    h1.wait()
    total = p * (p + 1) / 2
    check(bool((a == total).all() and (b == 10 * total).all() and (c == 100 * total).all()),
          f"{algo}: calls in flight at once gave {a[0].item()}, {b[0].item()}, {c[0].item()}")
    h = gc.broadcast(torch.full((9,), float(rank), device=DEV), src=p - 1, async_op=True)
    h.wait()
    check(h.is_completed(), f"{algo}: a waited handle is not completed")

# a subgroup of the last two ranks: roots are global ranks
members = [p - 2, p - 1]
g = dist.new_group(members)
x = torch.full((4,), float(rank), device=DEV)
got = gc.broadcast(x, src=p - 1, group=g)
if rank in members:
    check(bool((x == p - 1).all()), f"broadcast src={p - 1} in {members}: got {x[0].item()}")
else:
    check(got is None and bool((x == rank).all()), "a rank outside the group was changed")
y = torch.full((4,), float(rank), device=DEV)
gc.reduce(y, dst=p - 2, group=g)
if rank == p - 2:
    check(bool((y == 2 * p - 3).all()), f"reduce dst={p - 2} in {members}: got {y[0].item()}")
z = torch.full((4,), float(rank), device=DEV)
gc.all_reduce(z, group=g)
check(bool((z == (2 * p - 3 if rank in members else rank)).all()),
      f"all_reduce over {members}: got {z[0].item()}")
if rank in members:
    try:
        gc.broadcast(x, src=0, group=g)
        check(False, "src=0, outside the group, was taken")
    except Exception as e:  # noqa: BLE001 (the message is what is checked)
        check("src=0 is not in the group" in str(e), f"src outside the group: {e}")

# a parameter that requires grad, written in place as dist.all_reduce writes it
w = torch.nn.Parameter(torch.full((10,), float(rank), device=DEV))
gc.all_reduce(w, op="avg")
check(bool((w.detach() == (p - 1) / 2).all()) and w.requires_grad,
      f"a parameter's average: {w.detach()[0].item()}")
# a sparse aggregation issued while an async call is in flight on the group runs after it,
# as the group's own calls do (their messages interleaved on the same pairs of ranks)
from gradwire.sparse import sparse_allreduce  # noqa: E402


def sparse_once(method: str) -> torch.Tensor:
    x = torch.arange(1.0, 65.0, device=DEV) * (rank + 1)
    return sparse_allreduce(x, torch.zeros(64, device=DEV), 8, method)


for method in ("topk", "gtopk"):
    want = sparse_once(method)
    a = torch.full((200_000,), rank + 1.0, device=DEV)
    try:
        h = gc.all_reduce(a, algo="ring", async_op=True)
        got = sparse_once(method)
        h.wait(datetime.timedelta(seconds=60))
        check(torch.equal(got, want) and bool((a == p * (p + 1) / 2).all()),
              f"{method} beside an async all_reduce: {got[-8:].tolist()} != "
              f"{want[-8:].tolist()} or {a[0].item()}")
    except Exception as e:  # noqa: BLE001 (reported, then the rest)
        check(False, f"{method} beside an async all_reduce: {type(e).__name__}: {e}")
        break
done()
dist.destroy_process_group()
