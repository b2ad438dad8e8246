"""Every Python snippet of README.md and docs/*.md runs as pasted: each is written to a file
and run on two loopback ranks by gradwire's launcher (the environment torchrun gives)."""
import re
import sys
from pathlib import Path

import pytest

from gradwire.cluster import loopback_cluster
from gradwire.launcher import launch

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, code in enumerate(BLOCK.findall(doc.read_text())):
            out.append((f"{doc.relative_to(ROOT)}#{i + 1}", code))
    return out


def test_the_docs_have_python_snippets():
    assert len(snippets()) >= 5


@pytest.mark.parametrize("name,code", snippets(), ids=[n for n, _ in snippets()])
def test_a_docs_snippet_runs_as_pasted(name, code, tmp_path):
    path = tmp_path / "snippet.py"
    path.write_text(code)
    lines: list[str] = []
    res = launch(loopback_cluster(2), [sys.executable, str(path)], timeout=240,
                 sink=lines.append, extra_env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, f"{name}:\n" + "\n".join(lines[-40:])
