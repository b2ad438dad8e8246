"""Every registered algorithm, executed over gloo for P in {1,2,3,4,5,7,8}, equals
torch.distributed's own collective, and the transport counts exactly the schedule's bytes."""
import pytest
from conftest import run_checks


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8])
def test_every_algorithm_matches_torch_distributed(p):
    run_checks("collectives_check.py", p, timeout=600)
