"""The segment GEMM's CSR prologue against the traversal kernel + a plain GEMM, on the CSR of
RGCN's per-(destination, relation) mean of a synthetic profile (64 -> 64, fp32, one weight
per relation): row statistics of the CSR, the fused result's error, and the times of the
two-kernel path, the fused kernel with rows ordered by length within each relation, and
unordered.  CUDA only.

    python scripts/csr_prologue_ab.py wikikg2 biokg fb15k am
"""
import sys
import torch
from triton.testing import do_bench
from hector.bench import suites
from hector.compiler.steps_torch import GraphIndex
from hector.compiler.steps_triton.traversal import movement_csr
from hector.kernels.segment_mm.op import segment_mm, segment_mm_csr
from hector.kernels.traversal.op import traverse

chain = (("gather", "node", "edge", "src", None), ("scatter", "compact_dst", "edge", "dst", "mean"))
for name in sys.argv[1:]:
    W = suites.Workload(f"synthetic:{name}", torch.device("cuda"))
    g = W.graph
    ix = g.derived("compiler_index", lambda: GraphIndex(g))
    m = movement_csr(ix, chain)
    lens = m.ptr[1:] - m.ptr[:-1]
    b = m.layout
    print(f"{name}: rows {m.rows} nnz {m.nnz} max len {int(lens.max())} mean {lens.float().mean():.2f} "
          f"rows>8 {int((lens > 8).sum())} chunks {b.num_chunks}", flush=True)
    x = torch.randn(g.num_nodes, 64, device="cuda")
    S = g.num_relations
    w = torch.randn(S, 64, 64, device="cuda") * 0.1
    bounds = [int(v) for v in ix.ptr["compact_dst"]]
    seg = torch.repeat_interleave(torch.arange(S, device="cuda"),
                                  torch.tensor([bounds[i+1]-bounds[i] for i in range(S)], device="cuda"),
                                  output_size=m.rows)
    order = torch.argsort(seg * (m.nnz + 1) + lens, stable=True).int()
    two = lambda: segment_mm(traverse(m, x), w, bounds)
    fused = lambda: segment_mm_csr(x, w, bounds, m.ptr, m.col, m.val, gather=order, scatter=order,
                                   num_out_rows=m.rows, gather_unique=True, scatter_unique=True)
    fused_nosort = lambda: segment_mm_csr(x, w, bounds, m.ptr, m.col, m.val)
    ref = two()
    print("  max err", float((fused() - ref).abs().max() / ref.abs().max()), flush=True)
    for label, fn in (("traverse+gemm", two), ("fused sorted", fused), ("fused unsorted", fused_nosort)):
        print(f"  {label:16s} {do_bench(fn, warmup=10, rep=50):.3f} ms", flush=True)
