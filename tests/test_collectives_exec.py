"""Every registered algorithm, executed over gloo for P in {1,2,3,4,5,7,8}, equals
torch.distributed's own collective, and the transport counts exactly the schedule's bytes."""
import pytest
from conftest import script

from gradwire.cluster import loopback_cluster
from gradwire.launcher import launch


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8])
def test_every_algorithm_matches_torch_distributed(p):
    lines: list[str] = []
    res = launch(loopback_cluster(p), script("collectives_check.py"), timeout=600,
                 sink=lines.append)
    fails = [x for x in lines if "FAIL" in x]
    assert not fails, "\n".join(fails[:20])
    assert res.returncode == 0, "\n".join(lines[-30:])
    done = [x for x in lines if "CHECKED" in x]
    assert len(done) == p and all("failures=0" in x for x in done)
