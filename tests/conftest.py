import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.cluster import netns_available

SCRIPTS = Path(__file__).parent / "scripts"
BENCH_RANKS = Path(__file__).parent.parent / "benchmarks" / "ranks"
_ok, _why = netns_available()
needs_netns = pytest.mark.skipif(not _ok, reason=_why or "network namespaces unavailable")


def script(name: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name)]


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def link_names() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def gradwire_leftovers(name: str) -> list[str]:
    """Namespaces and links that still carry the cluster's name."""
    return sorted(n for n in netns_names() | link_names() if n.startswith(name))
