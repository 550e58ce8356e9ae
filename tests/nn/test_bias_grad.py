"""hector.kernels.reduce.column_sum (a bias gradient as one GEMV) gives what torch's reduction gives."""
import pytest
import torch

from hector.kernels.reduce import column_sum


@pytest.mark.parametrize("shape", [(37, 5), (4, 6, 5), (0, 5)])
def test_column_sum_is_the_sum_over_leading_dims(shape):
    torch.manual_seed(0)
    dy = torch.randn(*shape, dtype=torch.float64)
    torch.testing.assert_close(column_sum(dy), dy.reshape(-1, shape[-1]).sum(0))
