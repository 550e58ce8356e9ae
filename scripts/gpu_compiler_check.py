"""hector.nn's compiled relational layers against PyG on the GPU (Triton backend).

    python scripts/gpu_compiler_check.py [--graphs aifb,fb15k-237,random] [--dtypes fp32,bf16]
                                         [--models rgcn,rgcn-b2,rgat,hgt] [--data DIR]

For every (layer, graph, dtype): a seeded PyG layer (biases, HGT skips and relation priors
set to non-zero values) is taken over with ``from_pyg(layer, backend='triton')`` and cast to
dtype; the reference is the PyG layer in float64 holding the *same dtype-rounded* parameters,
run on the same dtype-rounded inputs.  Compared: the output and, through
``torch.autograd.grad`` with one random upstream gradient, the gradients of x and of every
parameter, each as ||ours - ref|| / max(||ref||, 1e-2 * largest reference gradient norm)
(the floor keeps gradients that are ~0 in exact arithmetic from dividing by ~0).  Pass:
fp32 < 1e-4, bf16 < 2e-2 on the output; 5x that on gradients.  TF32 is switched off, so
fp32 means IEEE fp32 everywhere (hector's GEMMs follow torch's allow_tf32 flag).

Graphs: AIFB and FB15k-237 from <repo>/../shared/data (or <repo>/.gpu/data, or --data),
skipped with a printed reason when absent, with one node type 'n' for HGT; and a random
heterogeneous graph (3 node types, one relation without edges, isolated nodes, a duplicate
edge and a self loop).  Exit status 1 when any case fails or raises.

``--device cpu`` is a dry run for development machines (small inputs, backend 'torch' unless
--backend is given; 'triton' needs TRITON_INTERPRET=1 there).
"""
import argparse
import copy
import math
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA_CANDIDATES = [ROOT / ".." / "shared" / "data", ROOT / ".gpu" / "data"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOL = {"fp32": 1e-4, "bf16": 2e-2}
GRAD_FACTOR = 5.0
IN_DIM = 32


def log(*a):
    print(*a, flush=True)


# -- graphs ---------------------------------------------------------------------------------
class TestGraph:
    """One graph in both layouts: relational (global ids, edge_type) for RGCN/RGAT, and
    PyG hetero dicts (per-type local ids) for HGT."""

    def __init__(self, name, edge_index, edge_type, counts, relations):
        self.name = name
        self.edge_index, self.edge_type = edge_index, edge_type
        self.counts = dict(counts)                       # node type -> count, id order
        self.relations = [tuple(r) for r in relations]   # relation id -> (src, rel, dst)
        self.num_nodes = sum(self.counts.values())
        self.num_relations = len(self.relations)
        offsets, o = {}, 0
        for t, n in self.counts.items():
            offsets[t], o = o, o + n
        self.offsets = offsets
        # hetero dicts: local ids per relation (empty relations included)
        order = torch.argsort(edge_type, stable=True)
        per = torch.bincount(edge_type, minlength=self.num_relations).tolist()
        parts = torch.split(edge_index[:, order], per, dim=1)
        self.edge_index_dict = {}
        for (s, r, d), ei in zip(self.relations, parts):
            shift = torch.tensor([[offsets[s]], [offsets[d]]], device=ei.device)
            self.edge_index_dict[(s, r, d)] = (ei - shift).contiguous()

    @property
    def metadata(self):
        return list(self.counts), list(self.relations)

    def split(self, x):
        """x [N, F] (global ids) -> {node type: view}; gradients flow back to x."""
        return dict(zip(self.counts, torch.split(x, list(self.counts.values()), dim=0)))

    def describe(self):
        return (f"{self.name}: {self.num_nodes} nodes, {self.edge_index.shape[1]} edges, "
                f"{self.num_relations} relations, {len(self.counts)} node type(s)")


def homogeneous_graph(name, ds, device):
    """A relational dataset with one node type 'n'; relation i becomes ('n', 'r<i>', 'n')
    (relation names of real KGs contain '.', which PyG's ParameterDict keys cannot)."""
    r = int(ds.num_relations)
    ei = ds.edge_index.to(device)
    et = (ds.edge_type if ds.edge_type is not None
          else torch.zeros(ei.shape[1], dtype=torch.long)).to(device)
    return TestGraph(name, ei, et, {"n": int(ds.num_nodes)}, [("n", f"r{i}", "n") for i in range(r)])


def random_hetero_graph(device, scale=1.0, seed=0):
    """3 node types, 5 relations, one of them empty; the last 5 nodes of every type never
    appear in an edge (isolated); one duplicate edge and one self loop; a hub paper."""
    g = torch.Generator().manual_seed(seed)
    counts = {"paper": max(int(400 * scale), 12), "author": max(int(300 * scale), 10),
              "venue": max(int(30 * scale), 8)}
    rels = [("author", "writes", "paper"), ("paper", "cites", "paper"),
            ("paper", "in", "venue"), ("venue", "hosts", "author"),
            ("paper", "written_by", "author")]
    sizes = [int(2000 * scale), int(1500 * scale), int(400 * scale), 0, int(2000 * scale)]
    sizes = [max(n, 8) if n else 0 for n in sizes]
    eis = []
    for (s, _, d), n in zip(rels, sizes):
        src = torch.randint(0, counts[s] - 5, (n,), generator=g)
        dst = torch.randint(0, counts[d] - 5, (n,), generator=g)
        if n:
            hub = torch.rand(n, generator=g) < 0.15       # skew: one high in-degree node
            dst[hub] = 0
        eis.append(torch.stack([src, dst]))
    cites = eis[1]
    cites[:, 1] = cites[:, 0]          # duplicate edge
    cites[1, 2] = cites[0, 2]          # self loop (paper -> same paper)
    offsets, o = {}, 0
    for t, n in counts.items():
        offsets[t], o = o, o + n
    gl, ty = [], []
    for i, ((s, _, d), ei) in enumerate(zip(rels, eis)):
        gl.append(ei + torch.tensor([[offsets[s]], [offsets[d]]]))
        ty.append(torch.full((ei.shape[1],), i, dtype=torch.long))
    ei, et = torch.cat(gl, 1), torch.cat(ty)
    perm = torch.randperm(ei.shape[1], generator=g)   # interleave relations, as real inputs do
    return TestGraph("random", ei[:, perm].to(device), et[perm].to(device), counts, rels)


def data_dir(arg):
    if arg:
        return Path(arg)
    for c in DATA_CANDIDATES:
        if c.exists():
            return c
    return DATA_CANDIDATES[0]


def load_graphs(names, device, data, small):
    from hector import datasets
    for name in names:
        t0 = time.perf_counter()
        if name == "random":
            yield random_hetero_graph(device, scale=0.1 if small else 1.0), time.perf_counter() - t0
            continue
        folder = data / name
        if not folder.exists():
            log(f"SKIP graph {name}: dataset folder {folder} is absent")
            continue
        try:
            ds = datasets.load(name, root=str(folder))
        except Exception:
            log(f"SKIP graph {name}: loading {folder} failed:")
            traceback.print_exc()
            sys.stdout.flush()
            continue
        yield homogeneous_graph(name, ds, device), time.perf_counter() - t0


# -- layers ---------------------------------------------------------------------------------
def perturb(module, gen):
    """PyG initialises biases to 0 and HGT skips / relation priors to 1: randomise them."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "bias" in name or "skip" in name or "p_rel" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + 0.1)


def build(model, G, device, backend):
    """(PyG layer in fp32 on device, hector layer taken over from it)."""
    import torch_geometric.nn as pyg
    from hector import nn as hnn
    torch.manual_seed(0)
    R = G.num_relations
    if model == "rgcn":
        ref, cls = pyg.RGCNConv(IN_DIM, 16, R), hnn.RGCNConv
    elif model == "rgcn-b2":
        ref, cls = pyg.RGCNConv(IN_DIM, 16, R, num_bases=2), hnn.RGCNConv
    elif model == "rgat":
        ref, cls = pyg.RGATConv(IN_DIM, 16, R, heads=2), hnn.RGATConv
    elif model == "hgt":
        ref, cls = pyg.HGTConv(IN_DIM, 32, G.metadata, heads=2), hnn.HGTConv
    else:
        raise ValueError(f"unknown model {model!r}")
    perturb(ref, torch.Generator().manual_seed(1))
    ref = ref.to(device)
    return ref, cls.from_pyg(ref, backend=backend)


def forward(model, layer, G, x):
    """Output as one [rows, F] tensor (HGT: node types in sorted order, concatenated)."""
    if model == "hgt":
        eid = G.edge_index_dict
        out = layer(G.split(x), eid)
        return torch.cat([out[t] for t in sorted(out)], 0)
    return layer(x, G.edge_index, G.edge_type)


def norm(t):
    return float(t.detach().double().norm())


def run_case(model, G, dname, device, backend):
    dtype = DTYPES[dname]
    pyg_layer, ours = build(model, G, device, backend)
    ours = ours.to(dtype)
    ref = copy.deepcopy(pyg_layer).double()
    ours_params = dict(ours.named_parameters())
    with torch.no_grad():
        for n, p in ref.named_parameters():   # the same dtype-rounded values, in float64
            p.copy_(ours_params[n].double())
    del pyg_layer
    gen = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(G.num_nodes, IN_DIM, generator=gen, device=device).to(dtype)
    names = [n for n, _ in ref.named_parameters()]
    ref_params = dict(ref.named_parameters())

    xa = x.detach().clone().requires_grad_()
    out_a = forward(model, ours, G, xa)
    if out_a.dtype != dtype:
        raise TypeError(f"output dtype {out_a.dtype}, expected {dtype}")
    up = torch.randn(out_a.shape, generator=gen, device=device).to(dtype)
    ga = torch.autograd.grad(out_a, [xa] + [ours_params[n] for n in names], up,
                             allow_unused=True)
    xb = x.detach().double().requires_grad_()
    out_b = forward(model, ref, G, xb)
    gb = torch.autograd.grad(out_b, [xb] + [ref_params[n] for n in names], up.double(),
                             allow_unused=True)

    out_err = norm(out_a.double() - out_b) / max(norm(out_b), 1e-30)
    if not math.isfinite(norm(out_a.double())):
        out_err = float("inf")
    max_g = max([norm(v) for v in gb if v is not None] + [0.0])
    floor = max(1e-2 * max_g, 1e-30)
    worst, worst_name, problems = 0.0, "-", []
    for n, a, b in zip(["x"] + names, ga, gb):
        if b is None:
            continue          # unused in PyG too (RGAT's `mod` parameters)
        if a is None:
            problems.append(f"no gradient for {n}")
            worst, worst_name = float("inf"), n
            continue
        if a.shape != b.shape:
            problems.append(f"gradient shape of {n}: {tuple(a.shape)} vs {tuple(b.shape)}")
            worst, worst_name = float("inf"), n
            continue
        e = norm(a.double() - b) / max(norm(b), floor)
        if not math.isfinite(e):
            e = float("inf")
        if e > worst or worst_name == "-":
            worst, worst_name = e, n
    tol = TOL[dname]
    ok = out_err < tol and worst < GRAD_FACTOR * tol and not problems
    return ok, out_err, worst, worst_name, problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", default="aifb,fb15k-237,random")
    p.add_argument("--models", default="rgcn,rgcn-b2,rgat,hgt")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--data", default=None, help="folder holding aifb/ and fb15k-237/")
    p.add_argument("--backend", default=None, help="hector backend (default: triton on CUDA, "
                   "torch on CPU)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)   # 'cpu': dry run
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("CUDA is not available; this check needs a GPU (use --device cpu for a dry run)")
        return 2
    backend = args.backend or ("triton" if device.type == "cuda" else "torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    import triton
    import torch_geometric
    log(f"torch {torch.__version__}, triton {triton.__version__}, torch_geometric "
        f"{torch_geometric.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
        + f", backend {backend}, tf32 off")
    data = data_dir(args.data)
    models = args.models.split(",")
    dnames = args.dtypes.split(",")
    for d in dnames:
        if d not in DTYPES:
            p.error(f"unknown dtype {d!r}; choose from {sorted(DTYPES)}")
    passed = failed = 0
    failures = []
    log(f"{'model':8s} {'graph':10s} {'dtype':5s} {'out err':>9s} {'grad err':>9s} "
        f"{'(worst gradient)':30s} result")
    for G, t_load in load_graphs(args.graphs.split(","), device, data, device.type == "cpu"):
        log(f"# {G.describe()} (loaded in {t_load:.1f} s)")
        for model in models:
            for dname in dnames:
                t0 = time.perf_counter()
                try:
                    ok, oe, ge, gname, problems = run_case(model, G, dname, device, backend)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    tag = "PASS" if ok else "FAIL"
                    log(f"{model:8s} {G.name:10s} {dname:5s} {oe:9.2e} {ge:9.2e} "
                        f"({gname[:28]:28s}) {tag}  [{time.perf_counter() - t0:.1f} s]"
                        + ("".join(f"\n    {m}" for m in problems)))
                except Exception as exc:       # report and go on with the next case
                    ok = False
                    log(f"{model:8s} {G.name:10s} {dname:5s} {'-':>9s} {'-':>9s} "
                        f"({'exception':28s}) FAIL  {type(exc).__name__}: {str(exc)[:200]}")
                    traceback.print_exc()
                    sys.stderr.flush()
                if ok:
                    passed += 1
                else:
                    failed += 1
                    failures.append(f"{model}/{G.name}/{dname}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        del G
    log(f"{passed} passed, {failed} failed" + (f": {', '.join(failures)}" if failures else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
