"""hector.bench.timing helpers that the measuring scripts share."""
import pytest
import torch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode)")
def test_cuda_syncs_counts_host_reads_by_line():
    from hector.bench.timing import cuda_syncs
    t = torch.ones(4, device="cuda")
    out, where = cuda_syncs(lambda: (t.sum().item(), t.nonzero(), t + 1))
    assert out[0] == 4.0
    assert sum(where.values()) == 2 and all("test_timing.py:" in k for k in where)
    assert cuda_syncs(lambda: t * 2)[1] == {}
