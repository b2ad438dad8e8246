"""Examples of output and error messages that README.md and docs/*.md show, produced from the
code for the input the doc describes, where no other test holds the doc's text."""
import types
from pathlib import Path

import pytest
import torch

from gradwire.collectives import agree
from gradwire.collectives.api import _flat
from gradwire.errors import GradwireError

ROOT = Path(__file__).resolve().parents[1]
RELIABILITY = ROOT / "docs" / "reliability.md"


def _doc_line(doc: Path, start: str) -> str:
    """The one line of ``doc`` that starts with ``start``."""
    (line,) = [x for x in doc.read_text().splitlines() if x.startswith(start)]
    return line


def _refusal_seen_by_rank_0() -> str:
    """reliability.md's input: rank 1 of an allreduce/ring refuses a bool tensor, rank 0 makes
    the call; the RefusedError rank 0 raises, built by the header exchange's own code from
    rank 1's reason (the exchange itself, which only moves the two headers, stubbed)."""
    with pytest.raises(GradwireError) as refused:  # the reason rank 1 sends (refused_together)
        _flat(torch.zeros(4, dtype=torch.bool), "tensor")
    reason = str(refused.value)
    call = [("call", "allreduce"), ("algo", "ring"), ("elements", 4), ("dtype", torch.float32),
            ("root", None), ("params", "")]
    rows = torch.stack([agree.encode(call), agree._refusal(reason)])
    rank0 = types.SimpleNamespace(world_size=2, rank=0, check_calls=True,
                                  device=torch.device("cpu"))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(agree, "_exchange", lambda transport, mine, what: rows)
        with pytest.raises(agree.RefusedError) as e:
            agree.agree(rank0, call)  # type: ignore[arg-type]
    return str(e.value)


def test_the_refusal_example_is_what_rank_0_raises():
    """The peers' error holds the refusing rank's whole reason: the header carries at most
    167 bytes of it, and the dtype refusal once cut its list at 'torch.i...'."""
    shown = _doc_line(RELIABILITY, "rank 0: no rank runs allreduce/ring: rank 1 refused it: ")
    assert _refusal_seen_by_rank_0() == shown
