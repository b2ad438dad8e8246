"""An earlier commit's ``src`` beside this checkout's, for A/B benchmarks: a temporary
`git worktree`, removed on exit. Put the path first on PYTHONPATH and the processes started
with that environment (ranks included) import the earlier code."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).parent.parent


def revision(rev: str = "HEAD") -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def this_code() -> str:
    """The code this checkout runs: HEAD's short hash, with "+uncommitted" when src/ has
    changes that are not committed (then its code is not HEAD's)."""
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"],
                           check=True, capture_output=True, text=True).stdout.strip()
    return revision() + ("+uncommitted" if dirty else "")


@contextmanager
def earlier_src(rev: str) -> Iterator[Path]:
    tree = Path(tempfile.mkdtemp(prefix="gradwire-ab-old-")) / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)
    try:
        yield tree / "src"
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)
