#!/usr/bin/env python
"""GPU check of the fused edge attention: Triton (both schedules) against the torch backend,
forward and backward, fp32 and bf16, on random graphs including a 100k-degree super node; then
timings of both schedules (and the torch backend) on ~1M-edge graphs.

    python scripts/gpu_attention_check.py [--quick] [--device cuda:0]

Needs CUDA; no network.  Exit status 1 when any comparison fails (the table still prints).
"""
from __future__ import annotations

import argparse
import math
import sys
import traceback

import torch

from hector import Graph
from hector.kernels.attention.op import edge_attention
from hector.kernels.attention.spec import AttentionSpec
from hector.device import num_sms
from hector.kernels.attention.plan import choose_strategy, make_plan

TERMS = {   # name: (tensors, kwargs, heads, dim_k, dim_v)
    "gat": (("v", "a_src", "a_dst"), dict(negative_slope=0.2), 8, 0, 8),
    "transformer": (("v", "q", "k"), dict(scale=1 / math.sqrt(32)), 4, 32, 32),
    "all+dropout": (("v", "q", "k", "a_src", "a_dst"),
                    dict(scale=0.3, negative_slope=0.1, dropout=0.2, training=True, seed=5),
                    3, 24, 20),
}
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def random_graph(num_nodes, num_edges, super_degree=0, device="cuda", seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    if super_degree:
        dst[:super_degree] = 0            # node 0 becomes a super node
        src[super_degree:2 * super_degree] = 1   # node 1 a super *source* (out-degree skew)
    return Graph(torch.stack([src, dst]).to(device), num_nodes=num_nodes)


def make_inputs(g, terms, dtype, requires_grad=True):
    names, _, heads, dk, dv = TERMS[terms]
    n = g.num_nodes
    shapes = dict(v=(n, heads, dv), q=(n, heads, dk), k=(n, heads, dk), a_src=(n, heads),
                  a_dst=(n, heads))
    return {k: torch.randn(shapes[k], device=g.device, dtype=dtype).requires_grad_(requires_grad)
            for k in names}


def run(g, x, terms, **kw):
    kw = dict(TERMS[terms][1], **kw)
    out = edge_attention(g, **x, **kw)
    return out


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def check(g, label, dtypes, failures):
    print(f"\n== {label}: {g}")
    for stats, side in ((g.in_degree, "in"), (g.out_degree, "out")):
        print(f"   auto ({side}-degree): {choose_strategy(stats, g.num_edges, num_sms(g.device))[1]}")
    for terms in TERMS:
        for dtype in dtypes:
            x = make_inputs(g, terms, dtype)
            ref = run(g, x, terms, backend="torch")
            gout = torch.randn_like(ref)
            ref_grads = torch.autograd.grad(ref, list(x.values()), gout)
            for strategy in ("node", "edge"):
                try:
                    out = run(g, x, terms, backend="triton", strategy=strategy)
                    grads = torch.autograd.grad(out, list(x.values()), gout)
                    errs = {"out": rel_err(out, ref)}
                    errs.update({f"d{n}": rel_err(a, b) for n, a, b in zip(x, grads, ref_grads)})
                    worst = max(errs.values())
                    ok = worst <= TOL[dtype] and all(torch.isfinite(t).all() for t in (out, *grads))
                    status = "ok  " if ok else "FAIL"
                    print(f"   {status} {terms:12s} {str(dtype)[6:]:9s} {strategy:4s} worst rel err "
                          f"{worst:.2e}  " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()))
                    if not ok:
                        failures.append((label, terms, dtype, strategy, errs))
                except Exception as exc:   # keep going: report every configuration
                    traceback.print_exc()
                    failures.append((label, terms, dtype, strategy, repr(exc)))
            del x, ref, ref_grads
            torch.cuda.empty_cache()


def bench(fn, grad_to_none=None):
    from triton.testing import do_bench
    try:
        return do_bench(fn, warmup=25, rep=200, grad_to_none=grad_to_none, return_mode="median")
    except TypeError:   # older triton: no return_mode
        return do_bench(fn, warmup=25, rep=200, grad_to_none=grad_to_none, quantiles=[0.5])


def timings(g, label, dtype=torch.bfloat16):
    print(f"\n== timings (ms, median, {str(dtype)[6:]}) on {label}: {g}")
    print(f"   {'terms':12s} {'pass':8s} {'node':>9s} {'edge':>9s} {'auto':>9s} {'torch':>9s}  auto picks")
    for terms in ("gat", "transformer"):
        x = make_inputs(g, terms, dtype)
        spec = AttentionSpec.of(x["v"], x.get("q"), x.get("a_src"), x.get("a_dst"),
                                TERMS[terms][1].get("negative_slope"))
        plan = make_plan(g, spec, "auto")
        for pass_ in ("fwd", "fwd+bwd"):
            row = []
            for backend, strategy in (("triton", "node"), ("triton", "edge"), ("triton", "auto"),
                                      ("torch", "auto")):
                def step():
                    out = run(g, x, terms, backend=backend, strategy=strategy)
                    if pass_ == "fwd+bwd":
                        out.backward(torch.ones_like(out))
                try:
                    with torch.no_grad() if pass_ == "fwd" else torch.enable_grad():
                        row.append(f"{bench(step, grad_to_none=list(x.values())):9.3f}")
                except torch.cuda.OutOfMemoryError:
                    row.append(f"{'OOM':>9s}")
                    torch.cuda.empty_cache()
            print(f"   {terms:12s} {pass_:8s} {' '.join(row)}  {plan.dst.strategy}/{plan.src.strategy}"
                  f" (block_e={plan.dst.block_e}, block_h={plan.dst.block_h}, chunk={plan.dst.chunk})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="skip the 1M-edge timings")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: this script checks the compiled kernels on a GPU "
              "(the CPU interpreter path is covered by tests/ops).")
        return 2
    device = torch.device(args.device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    print(f"device: {torch.cuda.get_device_name(device)}, {num_sms(device)} SMs, "
          f"torch {torch.__version__}")
    failures: list = []
    check(random_graph(3000, 30_000, device=device), "uniform random",
          (torch.float32, torch.bfloat16), failures)
    check(random_graph(500, 4_000, device=device, seed=1), "small, many empty rows",
          (torch.float32,), failures)
    check(random_graph(50_000, 250_000, super_degree=100_000, device=device, seed=2),
          "100k-degree super node", (torch.float32, torch.bfloat16), failures)
    if not args.quick:
        timings(random_graph(100_000, 1_000_000, device=device, seed=3), "uniform random ~1M edges")
        timings(random_graph(100_000, 1_000_000, super_degree=100_000, device=device, seed=4),
                "~1M edges with a 100k-degree super node")
    print(f"\n{len(failures)} failing configuration(s)")
    for f in failures:
        print("   ", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
