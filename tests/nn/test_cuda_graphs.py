"""GPU only (skipped without CUDA): every layer's forward + backward captured in a
``torch.cuda.CUDAGraph`` and replayed, and every layer under
``torch.compile(mode="reduce-overhead")``, equal to eager on the Triton backend.

Run on a GPU box: ``python -m pytest -q tests/nn/test_cuda_graphs.py`` (or
``scripts/gpu_capture_check.py``, which also times the steps)."""
import pytest
import torch

from hector.train.capture import capture_graph
from test_compile import LAYERS, assert_same, make_case, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def on_cuda(name):
    layer, args = make_case(name, backend="auto")
    dev = torch.device("cuda")
    moved = tuple({k: v.to(dev) for k, v in a.items()} if isinstance(a, dict) else a.to(dev)
                  for a in args)
    return layer.to(dev), moved


def captured_step(layer, args):
    """(replay, static output, static input gradients): forward + weighted-sum backward of
    ``layer`` recorded in one CUDA graph after eager warm-up on a side stream."""
    feats = args[0] if isinstance(args[0], dict) else {"x": args[0]}
    static = {k: v.detach().clone().requires_grad_() for k, v in feats.items()}
    call = (static if isinstance(args[0], dict) else static["x"],) + tuple(args[1:])

    def step():
        # Every call, warm-up and captured alike, starts from no gradient.
        layer.zero_grad(set_to_none=True)
        for t in static.values():
            t.grad = None
        out = layer(*call)
        flat = torch.cat([o.flatten() for o in out.values()]) if isinstance(out, dict) \
            else out.flatten()
        weights = torch.linspace(-1, 1, flat.numel(), device=flat.device)
        (flat * weights).sum().backward()
        return flat
    graph, flat = capture_graph(step, 3)
    return graph, flat, static


@pytest.mark.parametrize("name", LAYERS)
def test_cuda_graph_capture_of_forward_and_backward_matches_eager(name):
    layer, args = on_cuda(name)
    out, grads = run(layer, args)
    # The warm-up below would accumulate into these very tensors (backward adds into an
    # existing .grad in place), so keep copies of the eager values.
    grads = {k: v.clone() for k, v in grads.items()}
    graph, flat, static = captured_step(layer, args)
    for _ in range(2):            # replays overwrite, never accumulate
        graph.replay()
    torch.cuda.synchronize()
    got = {f"feature {k}": v.grad for k, v in static.items()}
    got.update({n: p.grad for n, p in layer.named_parameters() if p.grad is not None})
    assert_same((flat.detach(), got), (out, grads))


@pytest.mark.parametrize("name", LAYERS)
def test_reduce_overhead_compile_matches_eager(name):
    torch._dynamo.reset()
    layer, args = on_cuda(name)
    want = run(layer, args)
    compiled = torch.compile(layer, mode="reduce-overhead")
    for _ in range(3):            # warm-up, recording, replay
        got = run(layer, args, compiled)
    assert_same(got, want)
