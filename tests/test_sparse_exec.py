"""gradwire.sparse executed over gloo for P in {1, 2, 3, 5, 8}: identical results on every rank,
equal to the long-hand reference, mass conserved, and the transport counts exactly the
schedule's bytes (tests/scripts/sparse_check.py)."""
import pytest
from conftest import run_checks


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_sparse_allreduce_over_gloo(p):
    run_checks("sparse_check.py", p, timeout=300)
