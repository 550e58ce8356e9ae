"""A compiled layer's backward makes an expanded output gradient (``out.sum().backward()``
hands one with stride 0) dense once, not once per step that reads it: the gradients equal
those of a dense output gradient, and the backward copies the gradient at most once."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from test_csr_prologue import _graph, device_for
from hector.compiler import models
from hector.compiler.program import compile as hcompile


class _Copies(TorchDispatchMode):
    """Counts the dense copies (clone / copy_) made of tensors of ``shape``."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.clone, torch.ops.aten.copy_) and \
                isinstance(out, torch.Tensor) and tuple(out.shape) == self.shape:
            self.count += 1
        return out


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_expanded_output_gradient_is_made_dense_once(backend):
    g = _graph(num_nodes=12, num_edges=200, relations=8)
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(models.rgcn, backend=backend, in_dim=8, out_dim=12,
                 num_relations=g.num_relations).to(dev)
    g = g.to(dev)
    x = torch.randn(g.num_nodes, 8, device=dev, requires_grad=True)
    grads = []
    for dense in (True, False):
        out = m(g, x=x)
        dy = torch.ones(out.shape, device=dev) if dense else \
            torch.ones((), device=dev).expand(out.shape)
        counter = _Copies(out.shape)
        with counter:
            got = torch.autograd.grad(out, [x] + list(m.parameters()), dy)
        grads.append(got)
        if not dense:
            assert counter.count <= 1, f"{counter.count} copies of the output gradient"
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
