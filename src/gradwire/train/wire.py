"""Bytes that really left this host: the interface counters of the rank's network namespace."""

from __future__ import annotations

import os
from pathlib import Path


def tx_bytes() -> int | None:
    """Bytes sent on this rank's interface so far, headers included; None off the emulated
    cluster (on loopback every rank shares ``lo``, so its counter is no single rank's)."""
    ifname = os.environ.get("GRADWIRE_IFNAME")
    if not ifname or ifname == "lo":
        return None
    try:
        return int(Path(f"/sys/class/net/{ifname}/statistics/tx_bytes").read_text())
    except (OSError, ValueError):
        return None
