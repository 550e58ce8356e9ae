"""``hector::attention_merge_groups``: merging per-(dst, relation) softmax states into their
node (RGAT's attention) against a softmax over all of a node's edges computed directly, and its
autograd against torch autograd through the same math written with torch ops."""
import os

import pytest
import torch

from hector.kernels.attention.groups import merge_groups

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="no CUDA and TRITON_INTERPRET is not set")


def _case(seed, n=7, groups=15, heads=3, dim=5, edges_per_group=4):
    """Random scores per edge, grouped: group g of node node[g] holds edges_per_group edges.
    Node n - 1 gets no group (its output and log-sum-exp must be 0)."""
    gen = torch.Generator().manual_seed(seed)
    node = torch.randint(0, n - 1, (groups,), generator=gen)
    scores = torch.randn(groups, edges_per_group, heads, generator=gen, dtype=torch.float64) * 3
    values = torch.randn(groups, edges_per_group, heads, dim, generator=gen, dtype=torch.float64)
    return node, scores, values, n


def group_order(node, n):
    """(ptr, order): the groups sorted by node, node v's at order[ptr[v]:ptr[v + 1]]."""
    order = torch.sort(node, stable=True).indices
    counts = torch.bincount(node, minlength=n)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]), order


def _per_group(scores, values):
    """Each group's own softmax state: (o_g, l_g)."""
    lse = torch.logsumexp(scores, dim=1)
    alpha = torch.exp(scores - lse[:, None])
    return (alpha[..., None] * values).sum(1), lse


def _direct(node, scores, values, n):
    """The softmax over all of each node's edges, edge by edge."""
    heads, dim = scores.shape[-1], values.shape[-1]
    out = torch.zeros(n, heads, dim, dtype=scores.dtype)
    lse = torch.zeros(n, heads, dtype=scores.dtype)
    for v in range(n):
        mine = node == v
        if mine.any():
            s = scores[mine].reshape(-1, heads)
            lse[v] = torch.logsumexp(s, 0)
            alpha = torch.exp(s - lse[v])
            out[v] = (alpha[..., None] * values[mine].reshape(-1, heads, dim)).sum(0)
    return out, lse


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_merge_equals_the_softmax_over_all_edges(seed, dtype, tol):
    node, scores, values, n = _case(seed)
    o, lse = _per_group(scores, values)
    want_out, want_lse = _direct(node, scores, values, n)
    node_d = node.to(DEVICE)
    ptr, order = group_order(node_d, n)
    out, got_lse = merge_groups(ptr, order, node_d, o.to(DEVICE, dtype), lse.to(DEVICE))
    assert out.dtype == dtype and got_lse.dtype == torch.float32
    assert torch.allclose(out.double().cpu(), want_out, atol=tol, rtol=tol)
    assert torch.allclose(got_lse.double().cpu(), want_lse, atol=1e-5, rtol=1e-5)
    assert (out[n - 1] == 0).all() and (got_lse[n - 1] == 0).all()   # the node without groups


def test_merge_gradients_match_torch_autograd():
    node, scores, values, n = _case(2)
    o, lse = _per_group(scores, values)
    o, lse = o.float().requires_grad_(), lse.float().requires_grad_()
    w_out = torch.randn(n, *o.shape[1:])
    w_lse = torch.randn(n, o.shape[1])
    # reference: the same merge with torch ops
    top = torch.full((n, o.shape[1]), -torch.inf).scatter_reduce(
        0, node[:, None].expand(-1, o.shape[1]), lse.detach(), "amax")
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(lse - top[node])
    total = torch.zeros(n, o.shape[1]).index_add(0, node, e)
    ref_out = torch.zeros(n, *o.shape[1:]).index_add(0, node, o * (e / total[node])[..., None])
    ref_lse = top + torch.log(total.clamp_min(1e-30))
    has = total > 0
    ref_loss = (ref_out * w_out).sum() + (torch.where(has, ref_lse, 0.0) * w_lse).sum()
    ref = torch.autograd.grad(ref_loss, [o, lse])

    node_d = node.to(DEVICE)
    ptr, order = group_order(node_d, n)
    o_d, lse_d = o.detach().to(DEVICE).requires_grad_(), lse.detach().to(DEVICE).requires_grad_()
    out, got_lse = merge_groups(ptr, order, node_d, o_d, lse_d)
    loss = (out * w_out.to(DEVICE)).sum() + (got_lse * w_lse.to(DEVICE)).sum()
    got = torch.autograd.grad(loss, [o_d, lse_d])
    for a, b in zip(got, ref):
        assert torch.allclose(a.cpu(), b, atol=1e-5, rtol=1e-4)
