"""Launch budgets: operators dispatched per forward and per backward of one training step of
each layer on the Triton backend (``hector.bench.launches``; an aten op is about one GPU
kernel, a ``hector::`` custom op one to four Triton kernels).  The budgets are the counts of
the tiny test graph when they were pinned (issue 13): a change that adds launches fails here
and must either fold them away or raise the budget on purpose."""
import pytest
import torch

from hector.bench.launches import count_step, total
from test_compile import make_case

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter

#: layer -> (forward, backward) operator budget on the Triton backend.
BUDGET = {"gat": (8, 17), "agnn": (6, 6), "transformer": (7, 19), "rgcn": (11, 21),
          "rgat": (30, 79), "hgt": (56, 183)}
# HGT backward 182 -> 183 when movement traversals moved onto traversal_csr (6 launches, one
# per source, replacing torch gathers/scatters); counted under the interpreter as triton::...


def counts(name):
    layer, args = make_case(name, backend="triton")

    def forward():
        out = layer(*args)
        return torch.cat([o.flatten() for o in out.values()]) if isinstance(out, dict) else out
    forward().sum().backward()          # the first call plans and fills caches: not counted
    return count_step(forward)


@pytest.mark.parametrize("name", sorted(BUDGET))
def test_launches_per_step_within_budget(name):
    c = counts(name)
    fwd, bwd = BUDGET[name]
    assert total(c["forward"]) <= fwd, f"{name} forward: {dict(c['forward'])}"
    assert total(c["backward"]) <= bwd, f"{name} backward: {dict(c['backward'])}"


def test_attention_runs_as_one_custom_op_each_way():
    c = counts("gat")
    assert c["forward"]["hector::edge_attention"] == 1
    assert c["backward"]["hector::edge_attention_backward"] == 1
    assert not any(k.startswith("hector::") for k in c["forward"] if "backward" in k)
