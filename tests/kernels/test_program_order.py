"""``helpers.program_order``: the test harness that runs an interpreted launch's programs out
of grid order (GPU tests of kernels that coordinate programs run on the CPU with it)."""
import os

import pytest
import torch

from helpers import program_order

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="reorders the programs of Triton's interpreter (CPU only)")


def arrivals(grid):
    """Each program's arrival rank (an atomic ticket), by program id over a 2-D grid."""
    import triton
    import triton.language as tl

    @triton.jit
    def ticket(counter, out):
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        tl.store(out + pid, tl.atomic_add(counter, 1))

    counter = torch.zeros(1, dtype=torch.int32)
    out = torch.full((grid[0] * grid[1],), -1, dtype=torch.int32)
    ticket[grid](counter, out)
    return out.tolist()


def test_programs_run_once_each_in_the_order_asked():
    n = 5 * 7
    with program_order("grid"):
        assert arrivals((5, 7)) == list(range(n))
    with program_order("reversed"):
        assert arrivals((5, 7)) == list(range(n - 1, -1, -1))
        with program_order("grid"):                      # nested: grid order inside
            assert arrivals((5, 7)) == list(range(n))
        assert arrivals((5, 7)) == list(range(n - 1, -1, -1))    # the enclosing order back
    with program_order("shuffled", seed=1):
        first = arrivals((5, 7))
        second = arrivals((5, 7))
    assert sorted(first) == sorted(second) == list(range(n))     # every program once
    assert first != list(range(n)) and first != second           # a new order per launch


def test_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order must be one of"):
        with program_order("backwards"):
            pass
