"""What the rank scripts in tests/scripts share: one FAIL line per problem found, a final
CHECKED line (tests/conftest.py ``run_checks`` reads both), and the comparison of a
transport's byte and message counters with the traffic its schedule predicts, and the process
group they run on: gloo on the CPU, or NCCL on this rank's GPU when GRADWIRE_TEST_BACKEND=nccl
(tests/test_nccl.py)."""
import datetime
import os

import torch
import torch.distributed as dist

RANK = os.environ.get("RANK", "?")
BACKEND = os.environ.get("GRADWIRE_TEST_BACKEND", "gloo")
DEV = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if BACKEND == "nccl"
       else torch.device("cpu"))
fails: list[str] = []
checked = 0


def init() -> tuple[int, int]:
    """Join the process group (BACKEND, on DEV); (rank, world size)."""
    if DEV.type == "cuda":
        torch.cuda.set_device(DEV)
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=60))
    return dist.get_rank(), dist.get_world_size()


def fail(msg: str) -> None:
    fails.append(msg)
    print(f"FAIL rank {RANK}: {msg}", flush=True)


def counted() -> None:
    """One more case examined (for cases that report through :func:`fail`)."""
    global checked
    checked += 1


def check(ok: bool, msg: str) -> None:
    counted()
    if not ok:
        fail(msg)


def counters(tag: str, transport, traffic, rank: int) -> None:
    """The transport's per-peer bytes and messages must equal the schedule's ``traffic``."""
    want = (traffic.bytes_sent[rank].tolist(), traffic.bytes_received[rank].tolist(),
            traffic.messages_sent[rank].tolist())
    got = (transport.bytes_sent, transport.bytes_received, transport.messages_sent)
    if got != want:
        fail(f"{tag}: counters sent {got[0]} recv {got[1]} msgs {got[2]}, schedule says "
             f"{want[0]} {want[1]} {want[2]}")


def done() -> None:
    print(f"CHECKED rank {RANK} cases={checked} failures={len(fails)}", flush=True)
