"""``hector.explain``: what the compiler did to a layer on a graph, as readable text -- the IR
before and after each pass, every decision with its reason, the plan, which op each step
calls on each backend, and the Triton kernels those ops launch: each one's render
parameters, its file in the kernel cache, its config (the heuristic default, and any choice
the autotuner has recorded) and its rendered source; with ``launches=True`` also the kernel
launches of one training step's forward and backward (the layer is run once to count them).
``configure(parser)`` / ``run(args)`` back ``hector explain``."""
from __future__ import annotations

import argparse
from typing import Callable, List, Optional, Union

import torch

from .. import datasets
from ..device import interpreting, resolve_backend
from ..graph import Graph, with_self_loops
from ..kernels import autotune, registry
from ..kernels.attention import spec as attention_spec
from ..kernels.attention.launch import score_params
from ..kernels.attention.spec import AttentionSpec
from ..kernels.edgewise.launch import edgewise_params
from ..kernels.segment_mm import spec as gemm_spec
from ..kernels.segment_mm.launch import gemm_params
from ..kernels.segment_mm.spec import GemmSpec
from . import models
from .ir import Op
from .launches import count_step, summary
from .printer import format_ir
from .program import CompiledModule, Program
from .steps_torch import GraphIndex
from .steps_triton.attention import attention_launch

_OPS = {"gemm": "hector.kernels.segment_mm.op.segment_mm (Triton segment GEMM; "
                "torch: per-segment matmul)",
        "attention": "hector.kernels.attention.op.edge_attention (fused score+softmax+aggregate "
                     "Triton kernel)",
        "traversal": "torch index_select / index_add traversal",
        "weight": "torch (weight-only, once per call)",
        "select": "none (reads one gradient of the attention backward step)"}

#: A cosine step's op by its body's operator (``steps_triton.cosine``).
_COSINE = {Op.COSINE_QK: "hector::cosine_qk (Triton cosine_qk kernel; torch: "
                         "kernels.attention.cosine.cosine_qk_torch)",
           Op.COSINE_QK_BWD: "hector::cosine_qk_backward (Triton cosine_qk_bwd kernel; torch: "
                             "kernels.attention.cosine.cosine_qk_backward_torch)"}

_PICK = "none (reads one output of the {} step)"

_HEAD_BLOCKS = ("hector::head_blocks (Triton head_blocks kernel, its gradient one "
                "head_blocks_bwd; torch: a stack and a product)")

_TRAVERSAL_KERNEL = ("hector.kernels.traversal.op ({} Triton kernel; "
                     "torch backend: index_select / index_add)")

_EDGEWISE_KERNEL = ("hector.kernels.edgewise.op (generated edgewise Triton kernel; torch "
                    "backend: the same statements as torch ops)")

MODELS = ("rgcn", "rgat", "hgt")
#: Explained from their ``hector.nn`` layer (built by the command line, which may import
#: ``nn``): its compiled program, on the graph the layer runs on (GAT's and AGNN's self loops).
ATTENTION_MODELS = ("gat", "agnn", "transformer")


def _program(module_or_fn, **dims):
    if isinstance(module_or_fn, Program):
        return module_or_fn
    program = getattr(module_or_fn, "program", None)
    if isinstance(program, Program):
        return program
    if callable(getattr(module_or_fn, "program_for", None)):   # (one program per input width)
        if dims.get("features") is None:
            raise ValueError(f"explain({type(module_or_fn).__name__}) needs features=<the "
                             "width of x>: the layer compiles one program per width")
        return module_or_fn.program_for(dims["features"])
    if isinstance(module_or_fn, CompiledModule):
        return module_or_fn.program
    if callable(module_or_fn):
        return Program(module_or_fn, **dims)
    raise TypeError("explain needs a hector layer, a hector.compile module, a Program or a DSL "
                    f"function, got {type(module_or_fn).__name__}")


def explain(module_or_fn: Union[torch.nn.Module, Callable], graph, *, dtype=torch.float32,
            backward: bool = True, launches: bool = False, **dims) -> str:
    """The compilation of ``module_or_fn`` for ``graph`` as text (nothing is run, unless
    ``launches``: then one forward + backward on random inputs counts the kernel launches).

    ``module_or_fn``: a ``hector.nn`` layer, a ``hector.compile`` module, or a DSL function
    (then ``dims`` are its dimensions, as for ``hector.compile``)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a hector.Graph, got {type(graph).__name__}")
    program = _program(module_or_fn, **dims)
    loops = bool(getattr(module_or_fn, "add_self_loops", False))  # (GAT, AGNN: as they run)
    if loops:
        graph = with_self_loops(graph)
    program.check_graph(graph)
    cp = program.compile_exact(graph, dtype, backward=backward)   # decisions cite this graph
    s = cp.stats
    out = [f"== hector.explain: {getattr(program.fn, '__name__', 'layer')} "
           f"(options {program.options}, autodiff={program.autodiff})",
           f"graph: {s.num_nodes} nodes, {s.num_edges} edges, {s.num_relations} relations, "
           f"{s.num_node_types} node types; unique (src, rel) rows {s.compact_src_rows}, "
           f"unique (dst, rel) rows {s.compact_dst_rows}"
           + ("; self loops replaced by one per node, as the layer does" if loops else ""), ""]
    out.append(format_ir(program.traced.outputs, "captured IR"))
    for rec in cp.log:
        if not backward and (rec.name == "autodiff" or rec.name.startswith("backward/")):
            continue   # built by an earlier training call on this entry; not asked for here
        out.append("")
        out.append(f"-- pass {rec.name}")
        out.extend("  " + str(d) for d in rec.decisions)
        if rec.before != rec.after and rec.name != "autodiff":
            out.append(format_ir(rec.after, f"IR after {rec.name}"))
    kernels = _Kernels()
    for title, plan in (("forward plan", cp.forward_plan), ("backward plan", cp.backward_plan)):
        if plan is None or (title == "backward plan" and not backward):
            continue
        picks = sum(step.template == "select" for step in plan.steps)   # (launch nothing)
        out += ["", f"== {title} ({len(plan.steps)} steps"
                + (f", {picks} of them output picks that launch nothing" if picks else "")
                + ")", plan.describe(), "", "ops called:"]
        for i, step in enumerate(plan.steps):
            kern = step.spec.kernel if step.template == "traversal" else None
            out.append(f"  [{i}] " + (_EDGEWISE_KERNEL if kern == "edgewise" else
                                      _TRAVERSAL_KERNEL.format(kern) if kern else
                                      _gemm_op(step) if step.template == "gemm" else
                                      _HEAD_BLOCKS if step.body.op == Op.WBLOCKS else
                                      _PICK.format(step.body.attr("of"))
                                      if step.template == "select" and step.body.attr("of")
                                      else _cosine_op(step) if step.template == "cosine"
                                      else _OPS[step.template]))
            out.extend(f"      {line}" for line in _step_kernels(step, graph, kernels))
        if title == "backward plan":
            out.append(_parameters_only(cp))
    if launches:
        out += ["", launch_counts(program, graph, dtype)]
    return "\n".join(out + kernels.sources())


def _parameters_only(cp) -> str:
    """Which backward steps run when no input needs a gradient (``BackwardStage.part``)."""
    part = cp.backward_part(tuple(t for t in cp.grad_targets if t.op != Op.INPUT))
    kept = {s.output for s in part.plan.steps}      # (a step there may be narrowed)
    steps = [i for i, s in enumerate(cp.backward_plan.steps) if s.output in kept]
    return (f"when the inputs need no gradient (a first layer's features, a mini-batch's "
            f"input rows), steps {steps} run ({len(steps)} of {len(cp.backward_plan.steps)}) "
            f"and the forward keeps {len(part.saved_values)} of {len(cp.saved_values)} "
            f"values for them")


def launch_counts(program: Program, graph: Graph, dtype=torch.float32) -> str:
    """Kernel launches of one training step of ``program`` on ``graph``
    (``compiler.launches``), forward and backward, with random weights (the counts do not
    depend on their values), counted on the second call (the first plans and compiles)."""
    dev = graph.device
    gen = torch.Generator().manual_seed(0)
    module = CompiledModule(program).to(device=dev, dtype=dtype)
    inputs = {n: torch.randn(graph.num_nodes, v.dim, generator=gen).to(dev, dtype)
              for n, v in program.traced.inputs.items()}

    def forward():
        out = module(graph, **inputs)
        return torch.cat([o.flatten() for o in out]) if isinstance(out, tuple) else out
    leaves = list(module.parameters())
    backend = resolve_backend(program.backend, dev, dtype)
    forward().sum().backward()
    c = count_step(forward, dev.type, leaves)
    where = ("" if dev.type != "cpu" or interpreting() else
             "; on the CPU no kernel launches: aten ops counted as the GPU kernels they would "
             "be")
    return "\n".join([f"== kernel launches per training step ({backend} backend on {dev}{where})",
                      f"forward:  {summary(c['forward'])}",
                      f"backward: {summary(c['backward'])}"])


class _Kernels:
    """The registry kernels an explanation names: one line each where it is used, and each
    distinct one's source once at the end."""

    def __init__(self):
        self._seen = {}    # spec hash -> (name, params)

    def describe(self, name: str, params: dict, configs) -> List[str]:
        digest = registry.spec_hash(name, **params)
        if digest in self._seen:
            return [f"{name} ({digest[:16]}): as above"]
        self._seen[digest] = (name, params)
        flags = ", ".join(f"{k}={_flag(v)}" for k, v in sorted(params.items())) or "no parameters"
        lines = [f"{name} ({digest[:16]}; {flags})", f"  cache: {registry.materialise(name, **params)}"]
        if configs:
            first = autotune.config_dict(configs[0])
            lines.append(f"  config: {_config_text(first)} (the default; "
                         + (f"the autotuner times {len(configs)} configs once per shape bucket "
                            "on CUDA" if len(configs) > 1 else "not tuned") + ")")
            for key, rec in sorted(autotune.recorded(digest).items()):
                lines.append(f"  tuned {key.split('/')[2]} on {key.split('/')[3]}: "
                             f"{_config_text(rec.get('config', {}))}")
        return lines

    def traversal(self, name: str, spec, sched, bias: bool = False) -> List[str]:
        """``bias``: the forward adds an epilogue bias (the layer's, or a compiled
        attention's ``bias`` role)."""
        params = score_params(spec, sched.strategy)
        if name == "attention_fwd":
            params.update(has_bias=bias)
        elif name == "attention_bwd_dst":
            params.update(need_dq=spec.has_qk, need_ddst=spec.has_dst)
        elif name == "attention_bwd_src":
            params.update(need_dk=spec.has_qk, need_dv=True, need_dsrc=spec.has_src)
        return self.describe(name, params, attention_spec.tune_configs(sched))

    def sources(self) -> List[str]:
        out = []
        for digest, (name, params) in self._seen.items():
            out += ["", f"== generated kernel {name} ({digest[:16]})",
                    registry.source(name, **params).rstrip("\n")]
        return out


def _flag(value) -> str:
    """A render parameter as one short token (a generated program's text: its line count)."""
    text = str(value)
    return f"<{text.count(chr(10)) + 1} lines>" if "\n" in text or len(text) > 60 else text


def _config_text(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items() if v not in (0, "", None))


def _gemm_op(step) -> str:
    """The op a GEMM step calls on the Triton backend (``steps_triton.gemm``): the segment GEMM,
    its CSR prologue or CSR scatter epilogue variant, or a weight-gradient op."""
    body = step.body
    if body.op == Op.WSUM:
        return ("hector.kernels.segment_mm.custom_ops.segment_sums (bias gradient: the "
                "weight-gradient kernel over a column of ones)")
    if body.op == Op.WGRAD:
        csr = body.args[0].op == Op.SCATTER
        return (f"hector::segment_mm_wgrad{'_csr' if csr else '_sums' if step.extra else ''} "
                "(Triton weight-gradient kernel" + (", CSR prologue" if csr else "")
                + "; torch: per-segment matmul)")
    spec = step.spec[0] if isinstance(step.spec, tuple) else None
    if isinstance(spec, GemmSpec) and spec.has_csr_out:
        return ("hector.kernels.segment_mm.op.segment_mm_csr_scatter (Triton segment GEMM, "
                "CSR scatter epilogue; torch: per-segment matmul, then the CSR)")
    if isinstance(spec, GemmSpec) and spec.has_csr:
        return ("hector.kernels.segment_mm.op.segment_mm_csr (Triton segment GEMM, CSR "
                "prologue; torch: the CSR sums, then per-segment matmul)"
                + ("" if spec.accumulate else "; on a CSR with hub rows the traversal kernel "
                   "and segment_mm instead"))
    return _OPS["gemm"]


def _cosine_op(step) -> str:
    if "x" not in step.body.attr("needs", ("x",)):     # (lower.narrowed: dbeta alone)
        return "torch.dot (dbeta = <dq, k>: x needs no gradient)"
    return _COSINE[step.body.op]


def _step_kernels(step, graph, kernels: _Kernels) -> List[str]:
    """Lines naming the Triton kernels one plan step launches on the Triton backend."""
    if step.template == "cosine":
        return [] if "x" not in step.body.attr("needs", ("x",)) else kernels.describe(
            "cosine_qk" if step.body.op == Op.COSINE_QK else "cosine_qk_bwd", {}, None)
    spec = step.spec[0] if isinstance(step.spec, tuple) else step.spec
    if step.template == "gemm" and isinstance(spec, GemmSpec):
        return kernels.describe("segment_mm", gemm_params(spec),
                                gemm_spec.tune_configs(spec, interpreting=interpreting()))
    if step.template == "traversal" and getattr(spec, "edgewise", None) is not None:
        return kernels.describe("edgewise", dict(edgewise_params(spec.edgewise.program)), None)
    if step.template == "attention" and isinstance(spec, AttentionSpec):
        # The very objects run_attention launches (memoised on the graph's index).
        spec, plan = attention_launch(step, GraphIndex.of(graph))
        rows = step.spec[1]
        bias = "bias" in step.body.attr("roles", ())
        lines = [f"launch spec: {spec}", f"op graph: {rows}"]
        for side, sched, names in (("forward + destination-side backward", plan.dst,
                                    ("attention_fwd", "attention_bwd_dst")),
                                   ("source-side backward", plan.src, ("attention_bwd_src",))):
            lines += [f"{side}: {sched}"]
            for name in names:
                lines.extend("  " + line for line in kernels.traversal(name, spec, sched, bias))
        return lines
    return []


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``hector explain MODEL --dataset D``."""
    parser.add_argument("model", choices=MODELS + ATTENTION_MODELS,
                        help="layer to explain: a relational layer's compilation, or an "
                             "attention layer's fused kernels and schedule")
    parser.add_argument("--dataset", required=True,
                        help="dataset name (hector.datasets.load), e.g. aifb or synthetic:aifb")
    parser.add_argument("--root", default=None, help="local folder with the dataset files")
    parser.add_argument("--in-dim", type=int, default=16)
    parser.add_argument("--out-dim", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    for flag in ("reorder", "compact", "fuse"):
        parser.add_argument(f"--no-{flag}", action="store_true", help=f"disable the {flag} pass")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward plan")
    parser.add_argument("--no-launches", action="store_true",
                        help="do not run the layer once to count its kernel launches")
    parser.add_argument("--program", action="store_true",
                        help="gat, agnn, transformer: explain the layer's DSL program "
                             "(hector.compiler.models) through the compiler's passes instead "
                             "of hector.nn's layer")
    return parser


def run(args, attention_layer: Optional[Callable] = None) -> int:
    """``attention_layer(model, in_dim, out_dim, heads)``: the ``hector.nn`` layer of an
    attention model (the command line passes it: ``nn`` sits above the compiler)."""
    ds = datasets.load(args.dataset, root=args.root)
    graph = ds.graph
    launches = not args.no_launches and not args.forward_only
    dims = dict(in_dim=args.in_dim, out_dim=args.out_dim)
    if args.model in ATTENTION_MODELS:
        # (on one node set: an attention layer reads no relations or node types)
        homo = Graph(graph.input_edge_index(), num_nodes=graph.num_nodes)
        if not getattr(args, "program", False):
            if attention_layer is None:
                raise ValueError(f"hector explain {args.model}: no attention layer builder "
                                 "given")
            layer = attention_layer(args.model, args.in_dim, args.out_dim, args.heads)
            print(explain(layer, homo, backward=not args.forward_only, launches=launches,
                          features=args.in_dim))
            return 0
        # its DSL program: GAT and AGNN add one self loop per node, as their layers do
        graph = homo if args.model == "transformer" else with_self_loops(homo)
    else:
        dims.update(num_relations=graph.num_relations, num_node_types=graph.num_node_types)
    opts = {k: not getattr(args, f"no_{k}") for k in ("reorder", "compact", "fuse")}
    if args.model != "rgcn":
        dims["heads"] = args.heads
    program = Program(getattr(models, args.model), **opts, **dims)
    print(explain(program, graph, backward=not args.forward_only, launches=launches))
    return 0
