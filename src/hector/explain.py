"""``hector.explain``: what the compiler did to a layer on a graph, as readable text -- the IR
before and after each pass, every decision with its reason, the plan, and which op each
step calls on each backend.  ``configure(parser)`` / ``run(args)`` back ``hector explain``."""
from __future__ import annotations

import argparse
from typing import Callable, Union

import torch

from .ir.printer import format_ir

_OPS = {"gemm": "hector.ops_gemm.segment_mm (Triton segment GEMM; torch: per-segment matmul)",
        "attention": "hector.ops.edge_attention (fused score+softmax+aggregate Triton kernel)",
        "traversal": "torch index_select / index_add traversal",
        "weight": "torch (weight-only, once per call)"}

MODELS = ("rgcn", "rgat", "hgt")


def _program(module_or_fn, **dims):
    from .compile import CompiledModule, Program
    if isinstance(module_or_fn, Program):
        return module_or_fn
    program = getattr(module_or_fn, "program", None)
    if isinstance(program, Program):
        return program
    if isinstance(module_or_fn, CompiledModule):
        return module_or_fn.program
    if callable(module_or_fn):
        return Program(module_or_fn, **dims)
    raise TypeError("explain needs a hector layer, a hector.compile module, a Program or a DSL "
                    f"function, got {type(module_or_fn).__name__}")


def explain(module_or_fn: Union[torch.nn.Module, Callable], graph, *, dtype=torch.float32,
            backward: bool = True, **dims) -> str:
    """The compilation of ``module_or_fn`` for ``graph`` as text (nothing is run).

    ``module_or_fn``: a ``hector.nn`` relational layer, a ``hector.compile`` module, or a
    DSL function (then ``dims`` are its dimensions, as for ``hector.compile``)."""
    from .graph import Graph
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a hector.Graph, got {type(graph).__name__}")
    if hasattr(module_or_fn, "attention_spec"):
        return _explain_attention(module_or_fn, graph, dtype, dims.get("features"))
    program = _program(module_or_fn, **dims)
    program.check_graph(graph)
    cp = program.compiled_for(graph, dtype, backward=backward)
    s = cp.stats
    out = [f"== hector.explain: {getattr(program.fn, '__name__', 'layer')} "
           f"(options {program.options}, autodiff={program.autodiff})",
           f"graph: {s.num_nodes} nodes, {s.num_edges} edges, {s.num_relations} relations, "
           f"{s.num_node_types} node types; unique (src, rel) rows {s.compact_src_rows}, "
           f"unique (dst, rel) rows {s.compact_dst_rows}", ""]
    out.append(format_ir(program.traced.outputs, "captured IR"))
    for rec in cp.log:
        if not backward and (rec.name == "autodiff" or rec.name.startswith("backward/")):
            continue   # built by an earlier training call on this entry; not asked for here
        out.append("")
        out.append(f"-- pass {rec.name}")
        out.extend("  " + str(d) for d in rec.decisions)
        if rec.before != rec.after and rec.name != "autodiff":
            out.append(format_ir(rec.after, f"IR after {rec.name}"))
    for title, plan in (("forward plan", cp.forward_plan), ("backward plan", cp.backward_plan)):
        if plan is None or (title == "backward plan" and not backward):
            continue
        out += ["", f"== {title} ({len(plan.steps)} kernels)", plan.describe(), "", "ops called:"]
        for i, step in enumerate(plan.steps):
            out.append(f"  [{i}] {_OPS[step.template]}")
    return "\n".join(out)


def _explain_attention(layer, graph, dtype, features) -> str:
    """An attention layer (GAT, AGNN, Transformer): the fused op it calls, and for each
    traversal the schedule DF-GNN's dynamic fusion picks on this graph, and why."""
    from .graph import with_self_loops
    from .runtime.attention import make_plan
    g = with_self_loops(graph) if getattr(layer, "add_self_loops", False) else graph
    spec = layer.attention_spec(dtype, features)
    plan = make_plan(g, spec, layer.strategy)
    terms = [name for name, on in (("scale * <q_v, k_u>", spec.has_qk), ("a_src[u]", spec.has_src),
                                   ("a_dst[v]", spec.has_dst)) if on]
    out = [f"== hector.explain: {layer!r} (strategy={layer.strategy!r})",
           f"graph: {g.num_nodes} nodes, {g.num_edges} edges"
           + (" (self loops replaced by one per node)" if g is not graph else "")
           + f"; in-degree max {g.in_degree.max}, mean {g.in_degree.mean:.1f}, cv "
           f"{g.in_degree.cv:.2f}, {g.in_degree.num_super} super nodes",
           "",
           f"fused op: hector.ops.edge_attention, {spec.heads} head(s), score = "
           f"{' + '.join(terms)}" + (f", leaky_relu({spec.negative_slope})" if spec.has_leaky else "")
           + f", softmax over incoming edges, aggregate v ({spec.dim_v} per head)"
           + (", dropout on alpha" if spec.has_dropout else ""), ""]
    for side, sched, kernels in (
            ("forward + destination-side backward (CSR by destination)", plan.dst,
             "attention_fwd_kernel, attention_bwd_dst_kernel"),
            ("source-side backward (CSR by source, no atomics)", plan.src,
             "attention_bwd_src_kernel")):
        out += [f"-- {side}: {sched.strategy}-parallel",
                f"  why: {sched.reason}",
                f"  tiles: BLOCK_E={sched.block_e} BLOCK_H={sched.block_h} "
                f"BLOCK_DK={sched.block_dk} BLOCK_DV={sched.block_dv} num_warps={sched.num_warps}"
                + (f", chunk={sched.chunk} edges" if sched.strategy == "edge" else ""),
                f"  kernels (src/hector/codegen/triton_attention_*.py): {kernels}", ""]
    return "\n".join(out)


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``hector explain MODEL --dataset D``."""
    parser.add_argument("model", choices=MODELS, help="relational layer to compile")
    parser.add_argument("--dataset", required=True,
                        help="dataset name (hector.datasets.load), e.g. aifb or synthetic:aifb")
    parser.add_argument("--root", default=None, help="local folder with the dataset files")
    parser.add_argument("--in-dim", type=int, default=16)
    parser.add_argument("--out-dim", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    for flag in ("reorder", "compact", "fuse"):
        parser.add_argument(f"--no-{flag}", action="store_true", help=f"disable the {flag} pass")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward plan")
    return parser


def run(args) -> int:
    from . import datasets, models
    from .compile import Program
    ds = datasets.load(args.dataset, root=args.root)
    graph = ds.graph
    opts = {k: not getattr(args, f"no_{k}") for k in ("reorder", "compact", "fuse")}
    dims = dict(in_dim=args.in_dim, out_dim=args.out_dim, num_relations=graph.num_relations,
                num_node_types=graph.num_node_types)
    if args.model != "rgcn":
        dims["heads"] = args.heads
    program = Program(getattr(models, args.model), **opts, **dims)
    print(explain(program, graph, backward=not args.forward_only))
    return 0
