"""Random relational graphs for the compiler tests: empty relations, isolated nodes,
self loops and duplicate edges included on purpose."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch

import hector


#: The real datasets, never copied into the project: ``$HECTOR_TEST_DATA`` where set (a device
#: machine's copy), else ``shared/data`` beside the checkout.  Tests that need a dataset skip
#: with a reason when it is absent.
SHARED_DATA = Path(os.environ.get("HECTOR_TEST_DATA")
                   or Path(__file__).resolve().parents[1].parent / "shared" / "data")


#: Orders :func:`program_order` runs a launch's programs in.
PROGRAM_ORDERS = ("grid", "reversed", "shuffled")


@contextlib.contextmanager
def program_order(order: str, seed: int = 0):
    """Inside the block, Triton's interpreter runs each launch's programs in ``order``:
    "grid" (its own: one after another in grid order), "reversed", or "shuffled" (a random
    permutation per launch, drawn from ``seed``).  On a GPU programs run in any order and
    at once; the interpreter's fixed order would hide a kernel that assumes which program
    comes last (an arrival counter, a partial another program wrote).  A kernel that is
    right in every order gives the same integers and, up to fp32 summation order, the same
    floats.  ``$HECTOR_TEST_PROGRAM_ORDER`` runs the whole test run so (conftest)."""
    if order not in PROGRAM_ORDERS:
        raise ValueError(f"order must be one of {PROGRAM_ORDERS}, got {order!r}")
    from triton.runtime import interpreter
    builder = type(interpreter.interpreter_builder)
    outer = builder.set_grid_dim, builder.set_grid_idx       # (an enclosing order's, maybe)
    real_dim, real_idx = (getattr(f, "hector_real", f) for f in outer)
    rng = torch.Generator().manual_seed(seed)

    def set_grid_dim(self, x, y, z):
        real_dim(self, x, y, z)
        n = x * y * z
        self._hector_order = (list(range(n)) if order == "grid" else
                              list(range(n - 1, -1, -1)) if order == "reversed" else
                              torch.randperm(n, generator=rng).tolist())

    def set_grid_idx(self, x, y, z):
        _, gy, gz = self.grid_dim
        flat = self._hector_order[(x * gy + y) * gz + z]
        real_idx(self, flat // (gy * gz), flat // gz % gy, flat % gz)

    set_grid_dim.hector_real, set_grid_idx.hector_real = real_dim, real_idx
    builder.set_grid_dim, builder.set_grid_idx = set_grid_dim, set_grid_idx
    try:
        yield
    finally:
        builder.set_grid_dim, builder.set_grid_idx = outer


def random_relational(num_nodes=24, num_edges=90, num_relations=4, seed=0, empty=(1,)):
    """edge_index, edge_type with relations in ``empty`` having no edge and the last two
    nodes isolated; one duplicate edge and one self loop."""
    g = torch.Generator().manual_seed(seed)
    live = [r for r in range(num_relations) if r not in empty]
    ei = torch.randint(0, num_nodes - 2, (2, num_edges), generator=g)
    et = torch.tensor(live)[torch.randint(0, len(live), (num_edges,), generator=g)]
    ei[:, 1] = ei[:, 0]                    # duplicate edge
    et[1] = et[0]
    ei[1, 2] = ei[0, 2]                    # self loop
    return ei, et


def random_hetero(seed=0, heads_dim=8):
    """x_dict / edge_index_dict / metadata: 3 node types, 4 edge types, one without edges."""
    g = torch.Generator().manual_seed(seed)
    counts = {"paper": 9, "author": 7, "venue": 3}
    rels = [("author", "writes", "paper"), ("paper", "cites", "paper"),
            ("paper", "in", "venue"), ("venue", "hosts", "author")]
    eid = {}
    for (s, r, d), n in zip(rels, (20, 15, 6, 0)):
        eid[(s, r, d)] = torch.stack([torch.randint(0, counts[s] - 1, (n,), generator=g),
                                      torch.randint(0, counts[d] - 1, (n,), generator=g)])
    return counts, eid, (list(counts), rels)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) if b.numel() else 0.0


def device_for(backend):
    """Where a test runs ``backend``: Triton on CUDA when there is a GPU (conftest sets
    TRITON_INTERPRET=1 otherwise, and Triton then runs on CPU tensors)."""
    return torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")


HECTOR_SRC = str(Path(hector.__file__).parent)
#: Tensor -> Python conversions: each a device sync on CUDA.
READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "nonzero", "cpu",
         "numpy")


def forward_backward(m, g, dev, in_dim):
    """One forward of compiled module ``m`` on graph ``g`` (seeded input ``x`` of ``in_dim``
    features) and the backward of a weighted sum of its output: (output, gradients by
    parameter name and ``"x"``), on the CPU."""
    torch.manual_seed(2)
    x = torch.randn(g.num_nodes, in_dim).to(dev).requires_grad_()
    out = m(g, x=x)
    (out * torch.linspace(-1, 1, out.numel(), device=dev).view_as(out)).sum().backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    grads["x"] = x.grad
    return out.detach().cpu(), {k: v.cpu() for k, v in grads.items()}


@contextlib.contextmanager
def host_reads(functions=()):
    """Yields a list that collects (method, tensor, caller) for every read from hector code;
    ``functions``: names of ``torch`` functions that read a size back too (``unique``), spied
    on as well (their entries carry the first argument)."""
    seen = []
    saved = {name: torch.Tensor.__dict__.get(name) for name in READS}
    saved_fns = {name: getattr(torch, name) for name in functions}

    def spy_on(real, name):
        def spy(self, *a, **k):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(HECTOR_SRC):
                seen.append((name, self, f"{caller}:{sys._getframe(1).f_lineno}"))
            return real(self, *a, **k)
        return spy
    for name in READS:
        setattr(torch.Tensor, name, spy_on(getattr(torch.Tensor, name), name))
    for name, real in saved_fns.items():
        setattr(torch, name, spy_on(real, name))
    try:
        yield seen
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, fn)
        for name, fn in saved_fns.items():
            setattr(torch, name, fn)


def weighted_grads(m, g, in_dim: int, dev, dtype=torch.float32):
    """(output, gradients by parameter name and "x") of one forward of compiled layer ``m``
    on ``g`` (both on ``dev``) and a backward of ``sum(out * ramp)``, all as fp32 on the CPU;
    x is ``randn`` under seed 2."""
    torch.manual_seed(2)
    x = torch.randn(g.num_nodes, in_dim).to(dev, dtype).requires_grad_()
    out = m(g, x=x)
    (out.float() * torch.linspace(-1, 1, out.numel(), device=dev).view_as(out)).sum().backward()
    grads = {n: p.grad.float().cpu() for n, p in m.named_parameters()}
    grads["x"] = x.grad.float().cpu()
    return out.detach().float().cpu(), grads


def aten_ops(fn, nested: bool = False):
    """(``fn()``, how many aten ops it ran at top level, by name): what each costs a
    dispatcher call on the host (10-20 us a launch on CUDA), counted by torch.profiler on the
    CPU; ops an aten op runs inside itself are not counted again (``nested``: they are, e.g.
    the ``nonzero`` inside a boolean mask's ``index``)."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    ops = Counter()

    def walk(node):
        if node.name.startswith("aten::"):
            ops[node.name] += 1
            if not nested:
                return
        for child in node.children:
            walk(child)
    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return out, ops


def grads_by_pyg_name(module, loss, inputs, names):
    """Gradients of ``loss`` for ``inputs`` and then for ``module``'s parameters under PyG's
    ``names`` (HGTConv packs PyG's per-type parameters; ``in_pyg_layout`` slices them back),
    None where unused."""
    params = dict(module.named_parameters())
    got = torch.autograd.grad(loss, list(inputs) + list(params.values()), allow_unused=True)
    named = dict(zip(params, got[len(inputs):]))
    if hasattr(module, "in_pyg_layout"):
        named = module.in_pyg_layout(named)
    return list(got[:len(inputs)]) + [named[n] for n in names]


#: The ways a user can allow TF32 fp32 matmuls in torch (see :func:`set_tf32`).
TF32_APIS = ("allow_tf32", "fp32_precision", "matmul_precision")


def set_tf32(api: str, on: bool) -> None:
    """Allow (or forbid) TF32 fp32 matmuls through one of torch's APIs: the legacy
    ``allow_tf32``, the new ``fp32_precision`` or ``set_float32_matmul_precision``."""
    if api == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = on
    elif api == "fp32_precision":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
    else:
        torch.set_float32_matmul_precision("high" if on else "highest")


@contextlib.contextmanager
def tf32_state():
    """Put torch's TF32 switches back as they were (a test may set them any way)."""
    matmul = torch.backends.cuda.matmul
    new = hasattr(matmul, "fp32_precision")
    before = matmul.fp32_precision if new else matmul.allow_tf32
    try:
        yield
    finally:
        if new:
            matmul.fp32_precision = before
        else:
            matmul.allow_tf32 = before
