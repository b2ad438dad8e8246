"""Edges of the transport's checks (batch operations, peers, lazy views) and of the launcher's
output, each once a defect: see the docstrings."""
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gradwire.cluster import loopback_cluster
from gradwire.errors import GradwireError
from gradwire.launcher import launch
from gradwire.transport import P2P, Transport


def _transport(monkeypatch, backend: str = "gloo") -> tuple[Transport, list[tuple]]:
    """Rank 0 of three, without a process group: c10d's posting calls record what they were
    given instead of posting it."""
    posted: list[tuple] = []

    class Work:
        def wait(self, timeout=None):
            return True

    def post(name):
        def record(*args, **kwargs):
            posted.append((name, *args))
            return [Work()] if name == "batch_isend_irecv" else Work()
        return record

    for name in ("isend", "irecv", "batch_isend_irecv"):
        monkeypatch.setattr(dist, name, post(name))
    monkeypatch.setattr(dist, "P2POp", lambda *op: op)  # its checks need a process group
    t = Transport.__new__(Transport)
    t.group, t.rank, t.world_size, t.backend, t.timeout = None, 0, 3, backend, 5.0
    t._device_type, t._upstream, t._control = None, None, False
    t.reset_counters()
    return t, posted


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_batch_op_other_than_send_or_recv_is_refused_not_taken_for_a_receive(monkeypatch,
                                                                               backend):
    """P2P("Send", x, 1) was posted as a receive: the peer's matching receive and this one then
    both waited until the timeout, whose message named a receive nobody asked for."""
    t, posted = _transport(monkeypatch, backend)
    with pytest.raises(GradwireError, match=r"^rank 0: a batch takes P2P operations, each "
                                            r"'send' or 'recv', got 'Send'$"):
        t.batch([P2P("Send", torch.zeros(4), 1)])  # type: ignore[arg-type]
    with pytest.raises(GradwireError, match=r"got tuple$"):
        t.batch([("send", torch.zeros(4), 1)])  # type: ignore[list-item]
    assert posted == [] and t.bytes_received == [0, 0, 0] and t.messages_received == [0, 0, 0]


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_bad_operation_late_in_a_batch_leaves_nothing_posted_or_counted(monkeypatch,
                                                                         backend):
    """A batch whose second op names a peer out of range: gloo had posted (and counted) the
    first send before refusing, NCCL had counted it though nothing was posted."""
    t, posted = _transport(monkeypatch, backend)
    ops = [P2P("send", torch.zeros(4), 1), P2P("recv", torch.zeros(2), 2),
           P2P("send", torch.zeros(4), 5)]
    with pytest.raises(GradwireError, match=r"^rank 0: peer 5 is not valid: expected another "
                                            r"rank in 0\.\.2$"):
        t.batch(ops)
    assert posted == []
    assert t.bytes_sent == [0, 0, 0] and t.bytes_received == [0, 0, 0]
    assert t.messages_sent == [0, 0, 0] and t.messages_received == [0, 0, 0]
    # the same batch without the bad op is posted and counted exactly
    assert len(t.batch(ops[:2])) == (1 if backend == "nccl" else 2) and len(posted) == 1 + (
        backend == "gloo")
    assert t.bytes_sent == [0, 16, 0] and t.bytes_received == [0, 0, 8]
    assert t.messages_sent == [0, 1, 0] and t.messages_received == [0, 0, 1]


@pytest.mark.parametrize("peer,shown", [(1.0, "1.0"), ("1", "'1'"), (True, "True"),
                                        (None, "None"), ([1], r"\[1\]"),
                                        (torch.zeros(99), "Tensor")])
def test_a_peer_that_is_not_a_whole_number_is_refused_in_one_line(monkeypatch, peer, shown):
    """1.0 passed the range check and then indexed the counters (TypeError); "1" failed the
    comparison (TypeError); True was taken for rank 1. numpy's integers are ranks."""
    t, posted = _transport(monkeypatch)
    for call in (lambda: t.isend(torch.zeros(4), peer), lambda: t.irecv(torch.zeros(4), peer),
                 lambda: t.batch([P2P("send", torch.zeros(4), peer)])):
        with pytest.raises(GradwireError, match=rf"^rank 0: peer {shown} is not valid: "
                                                r"expected another rank in 0\.\.2$"):
            call()
    assert posted == [] and t.bytes_sent == [0, 0, 0] and t.bytes_received == [0, 0, 0]
    t.isend(torch.zeros(4), np.int64(2))
    assert t.bytes_sent == [0, 0, 16] and posted[0][0] == "isend"


@pytest.mark.parametrize("make,what", [
    (lambda: torch.tensor([1 + 2j, 3 - 4j]).conj(), r"conjugate view: call \.resolve_conj\(\)"),
    # the imaginary part of a conjugate view: negative, and contiguous where it is one element
    (lambda: torch.tensor([1 + 2j]).conj().imag, r"negative view: call \.resolve_neg\(\)")],
    ids=["conj", "neg"])
def test_a_lazy_conjugate_or_negative_view_is_refused_in_one_line(monkeypatch, make, what):
    """x.conj() is contiguous, but its bytes are x's: torch's dtype view refused it with a
    RuntimeError traceback (a negative view too). A non-tensor failed with an AttributeError."""
    t, posted = _transport(monkeypatch)
    x = make()
    for call in (lambda: t.isend(x, 1), lambda: t.irecv(x, 1),
                 lambda: t.batch([P2P("send", x, 1)])):
        with pytest.raises(GradwireError, match=rf"^transport needs tensors whose bytes are "
                                                rf"their values, got a {what} first$"):
            call()
    with pytest.raises(GradwireError, match=r"^transport sends and receives torch tensors, "
                                            r"got list$"):
        t.isend([1.0, 2.0], 1)  # type: ignore[arg-type]
    assert posted == [] and t.bytes_sent == [0, 0, 0]
    t.isend(x.resolve_conj().resolve_neg(), 1)  # resolved: sent
    assert len(posted) == 1


def test_a_quantized_tensor_is_refused_in_one_line(monkeypatch):
    """Its bytes lack its scale and zero point; c10d failed on it, and the transport reported
    that failure as the peer's (so the launcher named the peer as stalled)."""
    import warnings

    t, posted = _transport(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated
        q = torch.quantize_per_tensor(torch.arange(4.0), 0.5, 0, torch.quint8)
    for call in (lambda: t.isend(q, 1), lambda: t.irecv(q, 1),
                 lambda: t.batch([P2P("send", q, 1)])):
        with pytest.raises(GradwireError, match=r"^transport sends plain tensors, got a "
                                                r"quantized one: send its \.int_repr\(\)"):
            call()
    assert posted == [] and t.bytes_sent == [0, 0, 0]


@pytest.mark.parametrize("rows", [1, 0])
def test_a_column_of_one_row_or_none_goes_on_the_wire_in_place(monkeypatch, rows):
    """x[:, 1] of a one-row x is contiguous (one element) but keeps x's stride when flattened;
    of a row-less x, the same with none: the dtype view failed on both with a traceback.
    The bytes sent are the element's, and a receive lands in x itself."""
    t, posted = _transport(monkeypatch)
    x = torch.arange(3 * rows, dtype=torch.float32).reshape(rows, 3)
    col = x[:, 1]
    assert col.is_contiguous() and col.stride() == (3,)
    works = [t.isend(col, 1), t.irecv(col, 2)]
    assert [w is not None for w in works] == [bool(rows)] * 2
    assert t.bytes_sent == [0, 4 * rows, 0] and t.bytes_received == [0, 0, 4 * rows]
    if rows:
        (_, sent), (_, into) = [(name, args[0]) for name, *args in posted]
        assert sent.view(torch.float32).tolist() == [1.0]
        into.copy_(torch.tensor([9.5], dtype=torch.float32).view(torch.uint8))
        assert x.tolist() == [[0.0, 9.5, 2.0]]
    else:
        assert posted == []


RANK = ("import sys\n"
        "for i in range(2000):\n"
        "    sys.stdout.write(f'line {i}\\n')\n"
        "sys.stdout.write('END\\n')\n")


def test_the_tail_of_the_output_reaches_a_sink_slower_than_the_ranks():
    """A rank that wrote its output faster than the sink took it, then exited 0: the launcher
    waited a fixed 2 s for the rest and returned "all ranks exited 0" without about half the
    lines, END included."""
    lines: list[str] = []

    def sink(line: str) -> None:
        time.sleep(0.002)
        lines.append(line)

    res = launch(loopback_cluster(1), [sys.executable, "-c", RANK], timeout=30, sink=sink)
    assert res.returncode == 0, lines[-5:]
    assert lines == [f"[rank 0] line {i}" for i in range(2000)] + ["[rank 0] END"]
