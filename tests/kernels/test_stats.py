"""The count-facts kernel (``hector.kernels.stats``) against its torch reference: both kinds,
from pointers and from counts, int32 and int64, empty / short / hub / single rows, several
programs; and on CUDA, the two launches it replaces the torch reductions with."""
import pytest
import torch

from hector.kernels.stats import bin_facts, degree_facts
from hector.kernels.stats.op import BLOCK, launch_count_facts
from hector.kernels.stats.reference import bin_facts_torch, degree_facts_torch


def _counts(case: str, g: torch.Generator) -> torch.Tensor:
    if case == "mixed":
        c = torch.randint(0, 6, (300,), generator=g)
        c[torch.randint(0, 300, (5,), generator=g)] = torch.randint(9, 3000, (5,), generator=g)
        return c
    if case == "all_short":
        return torch.randint(0, 4, (50,), generator=g)
    if case == "all_long":
        return torch.randint(20, 40, (30,), generator=g)
    if case == "zeros":
        return torch.zeros(17, dtype=torch.long)
    if case == "one":
        return torch.tensor([2500])
    if case == "many_programs":        # more rows than one program folds
        return torch.randint(0, 30, (2 * BLOCK + 77,), generator=g)
    raise ValueError(case)


CASES = ("mixed", "all_short", "all_long", "zeros", "one", "many_programs")
#: Where the kernel runs: the GPU, else Triton's interpreter (set by conftest).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_bin_facts_kernel_equals_reference(case, dtype):
    c = _counts(case, torch.Generator().manual_seed(1))
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), c.cumsum(0)]).to(dtype)
    for short_max, chunk in ((8, 1024), (3, 8), (0, 1)):
        want = bin_facts_torch(ptr, short_max, chunk)
        got = launch_count_facts(ptr.to(DEVICE), True, "bins", short_max, chunk).cpu()
        assert got.dtype == torch.int64 and got.tolist() == want.tolist(), (short_max, chunk)
        short = c <= short_max
        long_len = torch.where(short, 0, c)
        assert want.tolist() == [int(short.sum()), int(c[short].max()) if short.any() else 0,
                                 int(long_len.sum()), int(c.max()),
                                 int(((long_len + chunk - 1) // chunk).sum())]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_degree_facts_kernel_equals_reference(case, dtype):
    d = _counts(case, torch.Generator().manual_seed(2)).to(dtype)
    for threshold in (1, 10, 1000):
        want = degree_facts_torch(d, threshold)
        got = launch_count_facts(d.to(DEVICE), False, "degrees", threshold, 1).cpu()
        assert got.tolist() == want.tolist(), threshold
        dl = d.long()
        assert want.tolist() == [int(dl.sum()), int((dl * dl).sum()), int(dl.max()),
                                 int((dl != 0).sum()), int((dl >= threshold).sum())]


def test_strided_input_is_read_as_its_values():
    c = torch.randint(0, 50, (400,), generator=torch.Generator().manual_seed(4))
    strided = c.to(DEVICE)[::2]
    assert not strided.is_contiguous()
    got = launch_count_facts(strided, False, "degrees", 10, 1).cpu()
    assert got.tolist() == degree_facts_torch(c[::2], 10).tolist()


def test_count_facts_refuse_bad_input():
    with pytest.raises(ValueError, match="ptr must be a 1-D int32/int64 tensor of at least 2"):
        bin_facts(torch.zeros(1, dtype=torch.long), 8, 1024)
    with pytest.raises(ValueError, match="degrees must be a 1-D int32/int64"):
        degree_facts(torch.zeros(3), 10)
    with pytest.raises(ValueError, match="degrees must be a 1-D"):
        degree_facts(torch.zeros(2, 2, dtype=torch.long), 10)


def test_count_facts_op_has_a_fake_for_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from hector.kernels.stats.op import count_facts_op
    with FakeTensorMode():
        out = count_facts_op(torch.zeros(9, dtype=torch.long), True, "bins", 8, 1024)
    assert out.shape == (5,) and out.dtype == torch.int64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_facts_are_one_kernel_and_a_fill():
    """The point of the kernel: two launches where the torch reductions were 12 (row bins)
    and 8 (degrees) per array, and the same integers."""
    from torch.profiler import ProfilerActivity, profile
    c = _counts("mixed", torch.Generator().manual_seed(3)).cuda()
    ptr = torch.cat([c.new_zeros(1), c.cumsum(0)])
    bin_facts(ptr, 8, 1024), degree_facts(c, 10)           # warm: compile outside the count
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        a, b = bin_facts(ptr, 8, 1024), degree_facts(c, 10)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) <= 4, [e.name for e in kernels]
    assert a.tolist() == bin_facts_torch(ptr.cpu(), 8, 1024).tolist()
    assert b.tolist() == degree_facts_torch(c.cpu(), 10).tolist()
