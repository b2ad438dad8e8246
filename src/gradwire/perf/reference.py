"""Named reference settings: what ``gradwire advise``, ``whatif`` and ``simulate`` assume about a
cluster when no ``gradwire calibrate`` file describes it.

A setting is a device and its network software: α per message, γ per byte reduced, the codec
table (encode and decode time of every method on that device), how much backward slows while
communication runs beside it (κ) and how coding shares the device with backward. The link
rate and the number of workers are the user's (``--bandwidth``, ``--workers``). Each term says
where it comes from; none is a measurement of the machine gradwire was developed on.

| name | device and network | α | γ | codecs | coding |
|------|--------------------|---|---|--------|--------|
| v100 | V100, Ethernet, NCCL ring (1) | 50 µs | 0.0033 ns/B | v100 (2) | after backward |
| h100 | H100, Ethernet, NCCL ring | 50 µs | 0.00115 ns/B | h100 (3) | after backward |

(1) the compression-utility paper's setting; (2) its Table 2; (3) measured on an H100.

"after backward": compression competes with backward for the device, so overlapping them is
no faster than running one after the other (the compression-utility paper, §3.1, Figure 3);
the model then charges a rank t_f + t_b + encode + decode + t_step at least, plus the last
bucket's messages, which nothing on the device runs beside (point 8 of
:mod:`gradwire.perf.model`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradwire.config import DEFAULT_ALPHA_S
from gradwire.errors import lookup

DEFAULT = "v100"


@dataclass(frozen=True)
class Reference:
    """One reference setting (the module docstring)."""

    name: str
    description: str
    alpha: float  # seconds per message
    gamma: float  # seconds per byte reduced
    codecs: str  # a built-in codec table (gradwire.perf.codecs)
    overlap_slowdown: float  # κ ≥ 1: backward beside communication
    coding_slowdown: float | None  # ≥ 1: coding and backward share the device; None: they don't
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def describe(self, codecs: str | None = None) -> str:
        """One line of the setting's terms; ``codecs``: the table given in place of its own."""
        coding = ("coding after backward (it shares the device)" if self.coding_slowdown
                  else "coding beside backward")
        table = (self.codecs if codecs in (None, self.codecs)
                 else f"{codecs} (given, for the setting's {self.codecs})")
        return (f"reference setting {self.name!r} ({self.description}): α "
                f"{self.alpha * 1e6:g} µs, γ {self.gamma * 1e9:.3g} ns/B, codecs "
                f"{table}, κ {self.overlap_slowdown:g}, {coding}")


_ALPHA = ("assumed: a typical per-message latency between hosts over Ethernet through NCCL's "
          "socket transport; no source gives it for this setting (gradwire calibrate measures "
          "yours)")
_OVERLAP = ("assumed 1: the compression-utility paper measures κ with Nsight (§4) but does not "
            "give its value")
_CODING = ("the compression-utility paper §3.1, Figure 3: compression overlapped with backward "
           "is slower than after it")

REFERENCES: dict[str, Reference] = {r.name: r for r in (
    Reference("v100", "V100 GPUs on Ethernet, NCCL ring: the compression-utility paper's "
              "setting", DEFAULT_ALPHA_S, 12 / 4 / 900e9, "v100", 1.0, 1.0,
              {"alpha": _ALPHA,
               "gamma": "derived: an fp32 add reads 8 and writes 4 bytes per 4 bytes reduced, "
                        "at the V100's 900 GB/s",
               "codecs": "the compression-utility paper, Table 2 (gradwire.perf.codecs v100)",
               "overlap_slowdown": _OVERLAP, "coding_slowdown": _CODING}),
    Reference("h100", "H100 GPUs on Ethernet, NCCL ring", DEFAULT_ALPHA_S,
              12 / 4 / 2.6e12, "h100", 1.0, 1.0,
              {"alpha": _ALPHA,
               "gamma": "derived: an fp32 add reads 8 and writes 4 bytes per 4 bytes reduced, "
                        "at about 2.6 TB/s (the H100 SXM's stream rate, below its 3.35 TB/s "
                        "peak)",
               "codecs": "measured on an H100 by benchmarks/compress_speed.py "
                         "(gradwire.perf.codecs h100)",
               "overlap_slowdown": "assumed 1 (not measured)", "coding_slowdown": _CODING}),
)}


def get(name: str) -> Reference:
    """The reference setting ``name``; an unknown one is a one-line error listing the known."""
    return lookup(REFERENCES, name, "reference setting")
