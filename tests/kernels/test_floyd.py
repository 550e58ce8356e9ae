"""The ``floyd`` sampling kernel and its torch reference: every row a uniform subset of
``min(d, k)`` distinct candidates, ascending, all of them where ``d <= k``; the kernel's draws
keyed by a device seed that each call advances (so a replay draws anew), the same seed the
same draws; uniform frequencies."""
import pytest
import torch

from hector.kernels.sampling import floyd_table
from hector.kernels.sampling import op as floyd_op
from hector.kernels.sampling.reference import floyd_table_torch

#: Where the kernel runs: the GPU, else Triton's interpreter (set by conftest).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check_rows(picks, valid, deg, k):
    for g in range(deg.numel()):
        d, kk = int(deg[g]), int(k[g])
        row = picks[g][valid[g]].tolist()
        assert len(row) == min(d, kk)
        assert row == sorted(set(row)), "picks distinct and ascending"
        assert all(0 <= v < d for v in row)
        if d <= kk:
            assert row == list(range(d))


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_rows_are_k_subsets(path):
    g = torch.Generator().manual_seed(0)
    deg = torch.randint(0, 40, (70,), generator=g)
    deg[:3] = torch.tensor([0, 1, 200])
    k = torch.randint(0, 9, (70,), generator=g)
    k[3] = 0
    width = 8
    if path == "kernel":
        seed = torch.tensor([123], device=DEVICE)
        picks, valid = floyd_table(deg.to(DEVICE), k.to(DEVICE), width, seed=seed)
        assert int(seed) == 124, "the call advances its seed"
    else:
        picks, valid = floyd_table_torch(deg, k, width, torch.Generator().manual_seed(1))
    assert picks.shape == (70, width) and valid.shape == (70, width)
    _check_rows(picks.cpu(), valid.cpu(), deg, k)


def test_kernel_draws_depend_on_the_seed_only():
    deg = torch.full((64,), 50, device=DEVICE)
    k = torch.full((64,), 5, device=DEVICE)
    a, _ = floyd_table(deg, k, 5, seed=torch.tensor([7], device=DEVICE))
    b, _ = floyd_table(deg, k, 5, seed=torch.tensor([7], device=DEVICE))
    c, _ = floyd_table(deg, k, 5, seed=torch.tensor([8], device=DEVICE))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert len({tuple(r) for r in a.tolist()}) > 50, "rows draw independently"


def test_kernel_is_uniform():
    """3 of 10 candidates, 6000 rows: each candidate kept with probability 3/10 (binomial sd
    ~35, tolerance 5 sd); each 3-subset (120 of them) about equally often."""
    n = 6000
    picks, valid = floyd_table(torch.full((n,), 10, device=DEVICE),
                               torch.full((n,), 3, device=DEVICE), 3,
                               seed=torch.tensor([2024], device=DEVICE))
    picks = picks.cpu()
    assert bool(valid.all())
    counts = torch.bincount(picks.reshape(-1), minlength=10).float()
    assert float((counts - 1800).abs().max()) < 5 * (n * 0.3 * 0.7) ** 0.5
    subsets = torch.bincount(picks[:, 0] * 100 + picks[:, 1] * 10 + picks[:, 2], minlength=1000)
    subsets = subsets[subsets > 0]
    assert subsets.numel() == 120
    assert int(subsets.max()) < 2.2 * n / 120


def test_needs_a_generator_where_the_kernel_does_not_run(monkeypatch):
    monkeypatch.setattr(floyd_op, "MAX_WIDTH", 0)
    with pytest.raises(ValueError, match="generator"):
        floyd_table(torch.ones(3, dtype=torch.long), torch.ones(3, dtype=torch.long), 1,
                    seed=torch.tensor([1]))
