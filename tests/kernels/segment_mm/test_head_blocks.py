"""``hector::head_blocks``: per-head column weights as one block-diagonal matrix, one kernel
each way, against the torch ops (values and gradients equal exactly: both only copy)."""
import sys
from pathlib import Path

import pytest
import torch

from hector.compiler.launches import CallCounter, total
from hector.kernels.segment_mm.head_blocks import head_blocks, head_blocks_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/helpers.py
from helpers import device_for  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter


@pytest.mark.parametrize("H,C,k,dtype", [(1, 4, 2, torch.float32), (2, 3, 2, torch.float32),
                                         (3, 5, 3, torch.float64), (4, 8, 1, torch.float32)])
def test_blocks_and_their_gradient_in_one_launch_each(H, C, k, dtype):
    dev = device_for("triton")      # (the kernel: on CUDA, or interpreted on the CPU)
    parts = [torch.randn(H, C, 1, dtype=dtype, device=dev, requires_grad=True)
             for _ in range(k)]
    with CallCounter(dev.type) as forward:
        out = head_blocks(parts)
    assert total(forward.launches) == 1
    want = torch.zeros(H * C, k * H, dtype=dtype, device=dev)
    for i, p in enumerate(parts):
        for h in range(H):
            want[h * C:(h + 1) * C, i * H + h] = p.detach()[h, :, 0]
    assert torch.equal(out, want) and torch.equal(head_blocks_torch(parts), want)
    g = torch.randn_like(out)
    with CallCounter(dev.type) as backward:
        out.backward(g)
    assert total(backward.launches) == 1
    ref = [p.detach().clone().requires_grad_() for p in parts]
    head_blocks_torch(ref).backward(g)
    for p, r in zip(parts, ref):
        assert p.grad.is_contiguous() and torch.equal(p.grad, r.grad)


def test_parts_must_agree():
    with pytest.raises(ValueError, match="head_blocks"):
        head_blocks([torch.randn(2, 3, 1), torch.randn(2, 4, 1)])
    with pytest.raises(ValueError, match="head_blocks"):
        head_blocks([torch.randn(2, 3, 2)])
