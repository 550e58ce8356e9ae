"""Fusion's grouping of operators into kernels (the ``fuse`` module's point 2, with the
GEMM prologues and epilogues of ``fuse_gemm`` applied as each kernel's body is built):
what is inlined into a traversal, what is materialised, which kernel each value's body
becomes."""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

from .. import ir as N
from ..ir import LEAVES, Op, Value, WEIGHT, arg, kernel, toposort
from ..lower import template_of
from ..lower_traversal import linear_traversal
from .common import Decision
from .fuse_gemm import (_bias_fits, _csr_gemm, _csr_scatter_linear, _dy_gather, _gemm_gather,
                        _prologue, _row_wgrad, _scatter_decision, _stored_weight,
                        _sums_compact_rows, csr_mode)
from .fuse_rewrite import NAME

#: What grouping never looks inside: leaves, and kernels already formed.
_OPAQUE = LEAVES + (Op.KERNEL,)


def _group(outputs, decisions: List[Decision], made: Dict[Value, Value], stats=None):
    order = toposort(outputs)
    consumers = Counter(a for v in order for a in set(v.args))
    is_output = set(outputs)
    apart = set()     # sums over a CSR kept out of the traversal that reads them (split)

    def inline_ok(a: Value, consumer: Value) -> bool:
        if a.op in _OPAQUE or a.kind == WEIGHT:
            return False
        if gemm_scatter(a) or gemm_csr_scatter(a):
            return False
        if Op.COLS in (a.op, consumer.op) or a.op == Op.PLACE:
            return False      # a window is a view of its materialised input; a place a concat
        if a in apart:
            decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", False,
                                      "a sum over a CSR that traversal_csr runs by itself "
                                      "(rows batched per program) stays out of an elementwise "
                                      "traversal, which would reduce one row per program"))
            return False
        if template_of(a) != "traversal" or template_of(consumer) not in ("traversal",):
            if template_of(a) == "traversal" and consumer.op == Op.LINEAR:
                decisions.append(Decision(NAME, f"{a.op} into linear", False,
                                          "the segment GEMM reads its input rows from memory"))
            return False
        if a in is_output:
            return False
        if consumers[a] > 1 and not _of_leaves(a):
            decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", False,
                                      f"read by {consumers[a]} operators: materialised once"))
            return False
        if consumers[a] > 1:
            decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", True,
                                      f"read by {consumers[a]} operators, elementwise of "
                                      "leaves: recomputed in each traversal that reads it"))
            return True
        decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", True,
                                  "single consumer in the same traversal"))
        return True

    def build(v: Value, inputs: List[Value], trail: Optional[List] = None) -> Value:
        """Body of the kernel rooted at ``v``; external inputs appended to ``inputs``;
        ``trail`` (optional) receives (value, its consumer) for every value inlined."""
        args = []
        for i, a in enumerate(v.args):
            if v.op == Op.LINEAR and a.op == Op.WT and a.kind == WEIGHT:
                args.append(N.wT(_placeholder(materialise(a.args[0]), inputs)))
            elif i == 0 and _gemm_gather(a, v):
                args.append(gemm_gather(a, v, inputs))
            elif i == 0 and _prologue(a, v):
                args.append(prologue(a, v, inputs))
            elif i == 0 and csr_prologue_ok(a, v):
                args.append(csr_prologue(a, v, inputs))
            elif inline_ok(a, v):
                if trail is not None:
                    trail.append((a, v))
                args.append(build(a, inputs, trail))
            else:
                args.append(_placeholder(materialise(a), inputs))
        return Value(v.op, tuple(args), v.kind, v.shape, v.attrs)

    def traversal(v: Value, inputs: List[Value]) -> Value:
        """``v``'s traversal body.  When it is not a linear traversal (``traversal_csr``
        cannot run it, so the edgewise kernel's reduce form would: one program per row) but
        a sum over a CSR inside it is one by itself, that sum becomes its own kernel and
        this one a row map reading it (HGT's dx: the compact rows' gradients summed per
        node, 3.6 -> ~1.2 ms on mag)."""
        logged, trail = len(decisions), []
        body = build(v, inputs, trail)
        if linear_traversal(body)[0] is not None:
            return body
        split = []
        for a, consumer in trail:
            if a.op != Op.SCATTER or consumer.op in (Op.SCATTER, Op.GATHER):
                continue
            mark = len(decisions)
            alone = build(a, [])
            del decisions[mark:]
            if linear_traversal(alone)[0] is not None:
                split.append(a)
        if not split:
            return body
        apart.update(split)
        del decisions[logged:]
        inputs.clear()
        return build(v, inputs)

    def materialise(v: Value) -> Value:
        if v.op in _OPAQUE:
            return v
        if v not in made:
            inputs: List[Value] = []
            template = template_of(v)
            if v.kind == WEIGHT:   # weight expressions stay whole: tiny, once per call
                body = _weight_body(v, inputs)
            elif addend_epilogue(v) is not None:
                body, template = with_addend(v, inputs), "gemm"
            elif epilogue(v) is not None:
                body, template = with_epilogue(v, inputs), "gemm"
            elif gemm_scatter(v):
                body = Value(v.op, (build(v.args[0], inputs),), v.kind, v.shape, v.attrs)
                template = "gemm"
            elif gemm_csr_scatter(v):
                g = v.args[0]
                body = Value(v.op, (Value(g.op, (build(g.args[0], inputs),), g.kind, g.shape,
                                          g.attrs),), v.kind, v.shape, v.attrs)
                template = "gemm"
            elif template == "traversal":
                body = traversal(v, inputs)
            else:
                body = build(v, inputs)
            made[v] = kernel(template, body, inputs)
        return made[v]

    scatter_epilogue: Dict[Value, bool] = {}
    scattered = set()      # linears whose rows a scatter epilogue sums (gemm_scatter)

    def gemm_scatter(v: Value) -> bool:
        """``v`` sums a typed linear's compact rows into their nodes (``scatter_sum_dst`` of
        (dst, relation) rows, ``scatter_sum_src`` of (src, relation) rows: one node per row),
        the linear read by nothing else: the GEMM's scatter epilogue does the sum -- when
        the graph has at least twice as many of those rows as nodes.  (The GEMM's atomics
        hide behind its FMA-bound product; what the epilogue adds is a zeroed node buffer and
        the node-row pass that adds the other terms, what it saves is the compact rows'
        write and read: RGCN forward on the H200, wikikg2 (5.2 rows per node) 7.89 -> 6.94
        ms, mag (0.78) 3.04 -> 3.13 ms.)"""
        if v in scatter_epilogue:
            return scatter_epilogue[v]
        lin = v.args[0] if _sums_compact_rows(v) else None
        ok = lin is not None and (lin.op == Op.LINEAR and _csr_gemm(lin) and consumers[lin] == 1
                                  and lin not in is_output)
        if ok:
            d = _scatter_decision(
                "scatter into linear (epilogue)", lin.kind, stats,
                "the segment GEMM sums each output row into its node row (fp32 atomics): no "
                "compact rows written and read back",
                "fewer than two rows per node: the node passes would cost more than the "
                "compact rows' round trip")
            decisions.append(d)
            ok = d.applied
        scatter_epilogue[v] = ok
        if ok:
            scattered.add(lin)
        return ok

    csr_scatter: Dict[Value, bool] = {}

    def gemm_csr_scatter(v: Value) -> bool:
        """``v`` sums a typed linear's compact rows into node rows through a gather onto
        the edges and a scatter off them (RGCN's backward: each (dst, relation) row's
        gradient ``dy[dst] W_r^T`` gathered onto its edges with the mean's ``1 / count`` and
        summed into their sources), the linear and the gather read by nothing else: the
        GEMM's CSR scatter epilogue adds each output row into the chain's node rows (fp32
        atomics), so the compact rows (on wikikg2 3.3 GB, at the training peak) are never
        written -- when those rows number at least twice the nodes (the scatter epilogue's
        question; ``HECTOR_CSR_PROLOGUE=0`` turns it off)."""
        if v in csr_scatter:
            return csr_scatter[v]
        lin = _csr_scatter_linear(v)
        ok = (lin is not None and csr_mode() != "0" and consumers[v.args[0]] == 1
              and consumers[lin] == 1 and lin not in is_output and v.args[0] not in is_output)
        if ok:
            d = _scatter_decision(
                "gather + scatter into linear (CSR scatter epilogue)", lin.kind, stats,
                "the segment GEMM adds each output row into the node rows of its row's edges "
                "(fp32 atomics, the chain's weights): no compact rows written and read back",
                "fewer than two rows per node: a traversal sums the GEMM's rows")
            decisions.append(d)
            ok = d.applied
        csr_scatter[v] = ok
        return ok

    def epilogue(v: Value) -> Optional[Tuple[Value, Value]]:
        """(linear, bias) when ``v`` is ``[reshape](add(linear, bias))`` and the GEMM can
        add the bias itself: the linear (not per head) read by the add alone, the add by the
        reshape alone, the bias a weight row sliced like the linear's weight."""
        add = v.args[0] if v.op == Op.RESHAPE else v
        if add.op != Op.ADD or (add is not v and (consumers[add] > 1 or add in is_output)):
            return None
        lin = [a for a in add.args if a.op == Op.LINEAR]
        bias = [a for a in add.args if a.kind == WEIGHT]
        if len(lin) != 1 or len(bias) != 1:
            return None
        (lin,), (bias,) = lin, bias
        if (consumers[lin] > 1 or lin in is_output or len(_stored_weight(lin).shape) != 2
                or not _bias_fits(lin, bias)):
            return None
        return lin, bias

    def addend_epilogue(v: Value) -> Optional[Tuple[Value, Optional[Value], Value]]:
        """(linear, bias or None, addend) when ``v`` is ``add(add(linear, addend), bias)``
        or ``add(linear, addend)`` (either order inside each add) and the addend is node
        rows another step writes anyway: a scatter-epilogue GEMM's output (``gemm_scatter``:
        RGCN's root linear then adds the relation sum its GEMM left in a node buffer, and
        the bias, as it stores its rows, instead of a node-row pass reading three node
        tensors and writing a fourth: 433 us of RGCN's 6.9 ms forward on synthetic wikikg2,
        H200), or a kernel's output, a pick of one or a leaf (GAT's backward adds the
        attention's value gradient to its scores' gradient times the attention vectors: one
        node-row pass and one ``[N, F]`` buffer fewer).  The linear: node rows, read by this
        add alone, one weight per segment (not per head), bias as ``epilogue`` takes one."""
        if v.op != Op.ADD or v.kind == WEIGHT:
            return None
        bias = next((a for a in v.args if a.kind == WEIGHT), None)
        inner = v
        if bias is not None:
            inner = next(a for a in v.args if a is not bias)
            if (inner.op != Op.ADD or consumers[inner] > 1 or inner in is_output
                    or any(a.kind == WEIGHT for a in inner.args)):
                return None
        lin = [a for a in inner.args if a.op == Op.LINEAR]
        rest = [a for a in inner.args if a.op != Op.LINEAR]
        if len(lin) != 1 or len(rest) != 1 or not (gemm_scatter(rest[0])
                                                    or gemm_csr_scatter(rest[0])
                                                    or rest[0].op in _OPAQUE + (Op.PICK,)):
            return None
        (lin,), (addend,) = lin, rest
        if (consumers[lin] > 1 or lin in is_output or len(_stored_weight(lin).shape) != 2
                or lin.kind != v.kind or addend.kind != v.kind
                or tuple(addend.shape) != tuple(v.shape) or lin.args[0].op == Op.SCATTER
                or (bias is not None and not _bias_fits(lin, bias))):
            return None
        return lin, bias, addend

    def with_addend(v: Value, inputs: List[Value]) -> Value:
        lin, bias, addend = addend_epilogue(v)
        rows = ("node rows another step wrote" if addend.op in _OPAQUE + (Op.PICK,)
                else "scatter GEMM's node rows")
        decisions.append(Decision(
            NAME, "sum into linear (addend epilogue)", True,
            f"the node GEMM adds the {rows}" + (" and the bias" if bias else "")
            + " as it stores its rows: no node-row pass over its inputs"))
        linear = build(lin, inputs)          # (x and W become the kernel's arguments 0, 1)
        if bias is not None:
            linear = N.binary(Op.ADD, linear, _placeholder(materialise(bias), inputs))
        return N.binary(Op.ADD, linear, _placeholder(materialise(addend), inputs))

    def with_epilogue(v: Value, inputs: List[Value]) -> Value:
        lin, bias = epilogue(v)
        decisions.append(Decision(NAME, "bias add into linear", True,
                                  "the segment GEMM's epilogue adds the bias row"))
        linear = build(lin, inputs)          # (x and W become the kernel's arguments 0, 1)
        add = N.binary(Op.ADD, linear, _placeholder(materialise(bias), inputs))
        return add if v.op == Op.ADD else Value(v.op, (add,), v.kind, v.shape, v.attrs)

    def _weight_body(v: Value, inputs: List[Value]) -> Value:
        if v.op in _OPAQUE:
            return _placeholder(v, inputs)
        # (a weight gradient inside is a GEMM step of its own: siblings' ``wcat`` of them)
        return Value(v.op, tuple(_weight_body(a, inputs)
                                 if a.kind == WEIGHT and template_of(a) == "weight"
                                 else gemm_gather(a, v, inputs) if i == 0 and _gemm_gather(a, v)
                                 else dy_gather(a, v, inputs) if i == 1 and _dy_gather(a, v)
                                 else prologue(a, v, inputs) if i == 0 and _prologue(a, v)
                                 else csr_prologue(a, v, inputs)
                                 if i == 0 and v.op == Op.WGRAD and csr_prologue_ok(a, v)
                                 else _placeholder(materialise(a), inputs)
                                 for i, a in enumerate(v.args)),
                     v.kind, v.shape, v.attrs)

    def prologue(a: Value, gemm: Value, inputs: List[Value]) -> Value:
        """``a`` (an elementwise function of rows) kept in the GEMM's body: its prologue."""
        decisions.append(Decision(NAME, f"{a.op} into {gemm.op}", True,
                                  "applied by the segment GEMM to each input tile it loads "
                                  "(prologue): no transformed copy of the rows"))
        return Value(a.op, (_placeholder(materialise(a.args[0]), inputs),), a.kind, a.shape,
                     a.attrs)

    def csr_prologue_ok(a: Value, gemm: Value) -> bool:
        """``a`` (a sum over a CSR of one input's rows, read by this typed linear or weight
        gradient alone) can be the GEMM's CSR prologue: the kernel sums each input row as it
        loads it.  For a linear whose scatter epilogue sums its rows (``gemm_scatter``: rows
        at least twice the nodes, nearly edge-sized) and for a weight gradient (the
        backward's rebuilt rows): the kernels walk rows cut into short pieces
        (``steps_triton.gemm``), and the summed rows are neither written nor saved.  Otherwise
        (rows stored once, which cannot be cut) only with ``HECTOR_CSR_PROLOGUE=1``: measured
        slower than the traversal kernel and a plain GEMM where a graph has long rows
        (docs/perf-notes.md, "Segment GEMM", the CSR prologue); ``HECTOR_CSR_PROLOGUE=0``:
        never."""
        mode = csr_mode()
        wgrad = _row_wgrad(gemm)
        if mode == "0" or not (mode == "1" or gemm in scattered or wgrad):
            return False
        if not ((_csr_gemm(gemm) or wgrad) and a.op == Op.SCATTER and a.kind != WEIGHT
                and template_of(a) == "traversal" and consumers[a] == 1
                and a not in is_output):
            return False
        mark = len(decisions)
        lt, _ = linear_traversal(build(a, []))
        del decisions[mark:]
        return lt is not None and len(lt.sources) == 1 and not lt.addends and lt.bias is None

    def csr_prologue(a: Value, gemm: Value, inputs: List[Value]) -> Value:
        decisions.append(Decision(NAME, f"{a.op} into {gemm.op}", True,
                                  "CSR prologue: the segment GEMM sums each input row through "
                                  "the traversal's CSR as it loads it (no summed rows written "
                                  "and read back)"))
        mark = len(decisions)
        body = build(a, inputs)
        del decisions[mark:]        # (its inner fusions are the traversal's usual ones)
        return body

    def dy_gather(a: Value, wgrad: Value, inputs: List[Value]) -> Value:
        """``a`` (a gather of node rows) kept in a weight gradient's body as its dy rows."""
        decisions.append(Decision(NAME, f"gather {a.args[0].kind}->{a.kind} into wgrad (dy)",
                                  True, "the weight-gradient kernel reads dy's node rows "
                                  "through the gather's index: no gathered copy"))
        return Value(a.op, (_placeholder(materialise(a.args[0]), inputs),), a.kind, a.shape,
                     a.attrs)

    def gemm_gather(a: Value, gemm: Value, inputs: List[Value]) -> Value:
        """``a`` (a gather of node rows) kept in the GEMM's body over its node rows."""
        decisions.append(Decision(NAME, f"gather {a.args[0].kind}->{a.kind} into {gemm.op}",
                                  True, "becomes the segment GEMM's gather index"))
        return Value(a.op, (_placeholder(materialise(a.args[0]), inputs),), a.kind, a.shape,
                     a.attrs)

    return [materialise(o) for o in outputs]


def _of_leaves(v: Value) -> bool:
    """An elementwise operator whose row inputs are all leaves (inputs, saved values,
    incoming gradients): recomputing it where it is read costs a multiply, not a tensor."""
    return (v.op in N.UNARY + N.BINARY and v.op not in (Op.EXP,)
            and all(a.op in LEAVES or a.kind == WEIGHT for a in v.args))


def _placeholder(v: Value, inputs: List[Value]) -> Value:
    if v not in inputs:
        inputs.append(v)
    return arg(inputs.index(v), v)
