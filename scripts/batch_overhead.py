"""Per-batch cost of mini-batch training: what a new graph costs next to the batch's compute.

    python scripts/batch_overhead.py [--device cuda] [--profile mag] [--scale 0.05]
                                     [--models rgcn,rgat,hgt] [--fanout 25,20]
                                     [--batch-size 1024] [--batches 10] [--threads N] [--pyg]
                                     [--count-syncs] [--stub-kernels] [--cpu-clock]
                                     [--cprofile N] [--torch-profile N] [--op-sites N]
                                     [--epoch-prefetch K] [--sampling]

For each batch of ``NeighborLoader`` on a synthetic profile (features of width ``--hidden``
drawn at random) and each model (two layers of hector's RGCNConv, RGATConv or HGTConv):

* sample: ``sample_hop`` + ``relabel`` of both hops (no ``Graph`` built);
* build: building the two block ``Graph`` s again from their edges (what a batch adds);
* compile: each layer's compiled entry for its new block (``Program.compiled_for``: the
  kept compiled stage put to the new shape's cost-model questions, or a compilation when it
  answers otherwise), forward and backward;
* first: forward + backward on the new blocks (graph indices, derived graphs, schedules
  built; autotune on CUDA);
* compute: forward + backward again on the same blocks (everything cached), the input
  features' gather by ``n_id`` included ("feature gather": that gather alone);
* plan = compile + first - compute: what a new graph shape costs a batch beyond its compute;
* pyg compute (with ``--pyg``): PyG's namesake layers, whose parameters ours take over
  (``from_pyg``), on the same blocks: forward + backward after a warm-up on the batch;
* syncs (with ``--count-syncs``, CUDA only): synchronizing CUDA calls (host reads of device
  tensors) of build and of first (and of first's backward alone: with several GPUs a sync
  there waits for the gradient all-reduces DDP started, so for the peer rank), and the
  Triton compilations of first (a kernel variant not
  met before: compiled, or loaded from Triton's disk cache); the syncs are counted by
  ``torch.cuda.set_sync_debug_mode`` on a second
  build of the batch's blocks (so the timings above are not slowed by the counting).

``--cprofile N``: each batch's first forward + backward run once more on fresh blocks under
cProfile (after the timings, which it does not touch), the top N functions printed to stderr.

``--op-sites N``: the ATen ops one new batch dispatches (its blocks' build; its first
forward + backward beyond the same step repeated), counted by the hector source line that
called them, top N sites to stderr: what a new graph costs the host, op by op (each op is a
dispatch, and on CUDA a launch), independent of timing noise.

``--torch-profile N``: torch.profiler tables (top N by self CPU time) of the last batch's first
forward + backward on fresh blocks and of the same step repeated, to stderr.

``--epoch-prefetch K``: instead of the above, wall time of whole epochs (``--batches``
batches: sampling, block builds and forward + backward; the torch backend on the CPU) with
``NeighborLoader(prefetch=0)`` and ``prefetch=K``, alternating, three epochs each: what
building the next batches in a background thread saves.

``--sampling``: instead of the above, sampling alone, per batch: the loader's (``sample_hop`` +
``relabel`` per hop, then the blocks' build), and into static-capacity buffers
(``NeighborLoader(static=True)``: eager, its cut into ``Graph`` blocks, and replayed from one
CUDA graph on CUDA), with each hop's capacities against the batches' actual sizes.

``--stub-kernels`` (CPU, under ``TRITON_INTERPRET=1``): the Triton backend's host path with
every Triton kernel launch skipped (outputs are left unwritten, so values are meaningless):
"plan" is then the host work a new batch adds on that backend (index arrays, movement CSRs,
derived graphs, row bins, launch set-up), which the CPU otherwise hides behind interpreted
kernels.

Prints medians in milliseconds per batch, one row per model.
"""
import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time

import torch

from hector.bench.timing import cuda_syncs
from hector.datasets import synthetic
from hector.graph.block import mark_block
from hector.loader import NeighborLoader, relabel, sample_hop
from hector.loader.neighbor import block_graph
from hector.nn import HGTConv, RGATConv, RGCNConv


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: What ``clock`` reads: wall time, or with ``--cpu-clock`` this process's CPU time (on a
#: CPU shared with other jobs, time spent waiting for a core is not counted).
TIMER = [time.perf_counter]


def clock(fn, device):
    sync(device)
    t0 = TIMER[0]()
    out = fn()
    sync(device)
    return TIMER[0]() - t0, out


def count_syncs(fn):
    """(``fn()``, how many synchronizing CUDA calls it made)."""
    out, where = cuda_syncs(fn)
    return out, sum(where.values())


#: Triton compilations so far (``JITFunction._do_compile`` calls: a kernel variant met for the
#: first time in this process, compiled or loaded from Triton's disk cache).
COMPILES = [0]


def count_triton_compiles():
    """Count Triton compilations in ``COMPILES`` (a new batch's integer arguments may meet a
    specialisation, such as divisibility by 16, that no earlier batch had)."""
    from triton.runtime.jit import JITFunction
    real = getattr(JITFunction, "_do_compile", None)
    if real is None:          # another Triton: not counted
        COMPILES[0] = float("nan")
        return

    def counted(self, *args, **kwargs):
        COMPILES[0] += 1
        return real(self, *args, **kwargs)
    JITFunction._do_compile = counted


def stub_triton_kernels():
    """Make every interpreted Triton launch a no-op (see ``--stub-kernels``)."""
    import os
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise SystemExit("--stub-kernels needs TRITON_INTERPRET=1 (the CPU's Triton backend)")
    from triton.runtime import interpreter
    interpreter.InterpretedFunction.run = lambda self, *args, **kwargs: None


def rebuild(block):
    """The block built again from its edges, the way the loader builds it."""
    g = block_graph(block, block.input_edge_index(), block.input_edge_type(),
                    block.node_type.long())
    return mark_block(g, block.num_dst_nodes, block.dst_index, block.dst_type_ptr)


def make_model(kind, graph, width, device, pyg=None, backend=None):
    """Two hector layers of ``kind`` (``backend``: the layers' default when None); with
    ``pyg`` (torch_geometric.nn) also PyG's two, whose parameters ours take over: ``(ours,
    pyg's or None)``."""
    R = graph.num_relations
    meta = (graph.node_type_names, graph.relation_names)
    args = {"rgcn": [(width, width, R), (width, width, R)],
            "rgat": [(width, width // 4, R), (width, width, R)],
            "hgt": [(width, width, meta), (width, width, meta)]}[kind]
    kw = {"rgcn": [{}, {}], "rgat": [dict(heads=4), {}], "hgt": [dict(heads=4)] * 2}[kind]
    if backend is not None:
        kw = [dict(k, backend=backend) for k in kw]
    ours_cls = {"rgcn": RGCNConv, "rgat": RGATConv, "hgt": HGTConv}[kind]
    if pyg is None:
        return torch.nn.ModuleList(ours_cls(*a, **k) for a, k in zip(args, kw)).to(device), None
    ref_cls = {"rgcn": pyg.RGCNConv, "rgat": pyg.RGATConv, "hgt": pyg.HGTConv}[kind]
    refs = torch.nn.ModuleList(ref_cls(*a, **k) for a, k in zip(args, kw)).to(device)
    return torch.nn.ModuleList(ours_cls.from_pyg(r) for r in refs).to(device), refs


def step(kind, model, graph, batch, x, pyg_layers=False, backward=torch.Tensor.backward):
    """Forward + backward of the two layers on the batch's blocks (``pyg_layers``: PyG's,
    called on the block's local edge_index, keeping the destination rows); ``backward(loss)``
    runs the backward (a counter may wrap it)."""
    h = x.index_select(0, batch.n_id)
    for conv, block in zip(model, batch.blocks):
        if pyg_layers and kind != "hgt":
            ei, et = block.input_edge_index(), block.input_edge_type()
            h = torch.relu(conv(h, ei, et)[:block.num_dst_nodes] if block.dst_index is None
                           else conv(h, ei, et)[block.dst_index.long()])
        elif kind == "hgt":
            ptr = block.host_ptr["node"]
            x_dict = {t: h[ptr[i]:ptr[i + 1]] for i, t in enumerate(graph.node_type_names)}
            out = conv(x_dict, _per_type_edges(block, graph) if pyg_layers else block)
            if pyg_layers:     # PyG returns every source row: keep each type's destinations
                out = {t: out[t][:block.dst_type_ptr[i + 1] - block.dst_type_ptr[i]]
                       for i, t in enumerate(graph.node_type_names) if out.get(t) is not None}
            # A type no relation enters has no output: its rows keep their features.
            h = torch.cat([out[t] if t in out else
                           h[ptr[i]:ptr[i] + block.dst_type_ptr[i + 1] - block.dst_type_ptr[i]]
                           for i, t in enumerate(graph.node_type_names)])
        else:
            h = torch.relu(conv(h, block))
    backward(h.float().square().mean())


def _per_type_edges(block, graph):
    """The block's edges per relation in PyG's hetero layout (ids within each type)."""
    ptr, names = block.host_ptr["node"], graph.node_type_names
    ei, et = block.input_edge_index(), block.input_edge_type()
    out = {}
    for r, (s, rel, d) in enumerate(graph.relation_names):
        e = ei[:, et == r]
        out[(s, rel, d)] = torch.stack([e[0] - ptr[names.index(s)], e[1] - ptr[names.index(d)]])
    return out


def torch_profile(kind, model, graph, batch, x, device, top):
    """torch.profiler tables (stderr) of a new batch's first step and of the step repeated
    on the same blocks: which host ops and waits a new graph adds (see ``--torch-profile``)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batch.blocks = [rebuild(b) for b in batch.blocks]
    for what in ("first step (new blocks)", "repeated step (cached)"):
        sync(device)
        with profile(activities=acts) as prof:
            step(kind, model, graph, batch, x)
            sync(device)
        print(f"--- {kind}: torch.profiler, {what}", file=sys.stderr)
        keys = ["self_cpu_time_total"] + (["self_device_time_total"] if device.type == "cuda"
                                          else [])
        for key in keys:
            print(prof.key_averages().table(sort_by=key, row_limit=top), file=sys.stderr)


def count_op_sites(fn) -> collections.Counter:
    """``fn()`` run once; the ATen ops it dispatched, counted by the innermost ``hector``
    source line that called them (``file:line function``; "(outside hector)" for the rest,
    and the autograd engine's own ops, which no Python frame calls)."""
    import traceback

    from torch.utils._python_dispatch import TorchDispatchMode
    counts = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            site = "(outside hector)"
            for frame in reversed(traceback.extract_stack(limit=40)):
                if "/hector/" in frame.filename:
                    path = frame.filename.split("/hector/", 1)[1]
                    site = f"{path}:{frame.lineno} {frame.name}"
                    break
            counts[site] += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return counts


def op_sites(kind, model, graph, batch, x, top):
    """The ATen ops (stderr) a new batch adds: its blocks' build, and its first forward +
    backward beyond the same step repeated, by hector call site (see ``--op-sites``)."""
    blocks = batch.blocks
    build = count_op_sites(lambda: [rebuild(b) for b in blocks])
    batch.blocks = [rebuild(b) for b in blocks]
    first = count_op_sites(lambda: step(kind, model, graph, batch, x))
    repeat = count_op_sites(lambda: step(kind, model, graph, batch, x))
    extra = first - repeat
    print(f"--- {kind}: ATen ops per new batch: build {sum(build.values())}, first step "
          f"{sum(first.values())}, repeated step {sum(repeat.values())} (the first's extra "
          f"{sum(first.values()) - sum(repeat.values())}); top sites of the extra, then of "
          "the build", file=sys.stderr)
    for counter in (extra, build):
        for site, n in counter.most_common(top):
            print(f"  {n:5d}  {site}", file=sys.stderr)
        print(file=sys.stderr)


def epoch_prefetch(args, graph, x, seeds, fanouts, device):
    """Wall time per epoch with and without ``prefetch`` (see ``--epoch-prefetch``): the
    layers' default backend on CUDA, the torch backend on the CPU (the interpreter would time
    itself)."""
    print("| model | batches | prefetch | epoch ms (3 runs) | median |")
    print("|---|---|---|---|---|")
    for kind in args.models.split(","):
        model, _ = make_model(kind, graph, args.hidden, device,
                              backend=None if device.type == "cuda" else "torch")
        times = {0: [], args.epoch_prefetch: []}
        for _ in range(3):
            for depth in times:
                loader = NeighborLoader(graph, fanouts, input_nodes=seeds,
                                        batch_size=args.batch_size, shuffle=True, seed=0,
                                        prefetch=depth)
                sync(device)
                t0 = time.perf_counter()
                for _, batch in zip(range(args.batches), loader):
                    step(kind, model, graph, batch, x)
                sync(device)
                times[depth].append(time.perf_counter() - t0)
        for depth, ts in times.items():
            print(f"| {kind} | {args.batches} | {depth} | "
                  + ", ".join(f"{1e3 * t:.0f}" for t in ts)
                  + f" | {1e3 * statistics.median(ts):.0f} |")


def sampling(args, graph, seeds, fanouts, device):
    """Per-batch sampling times, the loader's and into static buffers (see ``--sampling``)."""
    kw = dict(input_nodes=seeds, batch_size=args.batch_size, shuffle=True, seed=0)
    plain = NeighborLoader(graph, fanouts, **kw)
    static = NeighborLoader(graph, fanouts, static=True, **kw)
    cols = {"loader sample": [], "loader build": [], "static sample": [], "static cut": [],
            "static replay": []}
    sizes = []
    replay = None
    if device.type == "cuda":
        seed_buf = torch.zeros(args.batch_size, dtype=torch.int64, device=device)
        count = torch.tensor(args.batch_size, device=device)
        static.static.sample(seed_buf, count)                     # warm-up, then capture
        sync(device)
        graph_ = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph_):
            captured = static.static.sample(seed_buf, count)
        replay = (graph_, seed_buf, captured)
    for i, (batch, sb) in enumerate(zip(plain, static.static_batches())):
        if i > args.batches:
            break

        def sample_only():
            dst = batch.seed
            for f in plain.fanouts:
                src, _, _ = sample_hop(plain.index, dst, f, plain.generator)
                dst = relabel(plain.index, dst, src)[0]
        t, _ = clock(sample_only, device)
        cols["loader sample"].append(t)
        cols["loader build"].append(clock(lambda: [rebuild(b) for b in batch.blocks],
                                          device)[0])
        seeds_b = sb.seeds
        cols["static sample"].append(clock(lambda: static.static.sample(seeds_b), device)[0])
        cols["static cut"].append(clock(lambda: sb.to_batch(graph, static.node_type_ptr,
                                                            graph.node_type_names), device)[0])
        if replay is not None:
            replay[1].copy_(seeds_b)
            cols["static replay"].append(clock(replay[0].replay, device)[0])
        sizes.append(sb.sizes())
    if replay is not None and args.kernels:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
            for _ in range(5):
                replay[0].replay()
            torch.cuda.synchronize()
        print("--- static sampling: kernels of 5 replays by device time", file=sys.stderr)
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[
                :args.kernels]:
            print(f"  {e.self_device_time_total / 5e3:8.3f} ms  {e.count:5d}x  {e.key[:100]}",
                  file=sys.stderr)
    caps = static.static.caps
    print("| " + " | ".join(cols) + " |  (ms per batch, medians)")
    print("|" + "---|" * len(cols))
    print("| " + " | ".join(f"{1e3 * statistics.median(v[1:] or v):.2f}" if v else "-"
                            for v in cols.values()) + " |")
    for h in range(len(fanouts)):
        edges = statistics.median(s[h][1] for s in sizes)
        nodes = statistics.median(s[h][2] for s in sizes)
        print(f"hop {h}: edges {edges:,.0f} of capacity {caps.edges[h]:,} "
              f"({edges / max(caps.edges[h], 1):.0%}), nodes {nodes:,.0f} of "
              f"{caps.nodes[h]:,} ({nodes / max(caps.nodes[h], 1):.0%})")


def common_arguments(p: argparse.ArgumentParser, batches: int) -> None:
    """The arguments of the per-batch measurements."""
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--profile", default="mag")
    p.add_argument("--scale", type=float, default=None)
    p.add_argument("--models", default="rgcn,rgat,hgt")
    p.add_argument("--batches", type=int, default=batches)
    p.add_argument("--hidden", type=int, default=64)


def load_profile(args, device):
    """(the synthetic profile's dataset, its scale): ``--scale``, else the whole profile on
    CUDA and 5% of it on the CPU."""
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else 0.05)
    return synthetic.load(args.profile, device=device, scale=scale), scale


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(p, batches=10)
    p.add_argument("--fanout", default="25,20")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--pyg", action="store_true", help="also time PyG's layers on the blocks")
    p.add_argument("--count-syncs", action="store_true",
                   help="count synchronizing CUDA calls of build and first (CUDA only)")
    p.add_argument("--stub-kernels", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: skip every Triton launch (host path only)")
    p.add_argument("--cprofile", type=int, default=0, metavar="N",
                   help="cProfile each batch's first step once more on fresh blocks (apart "
                        "from the timings) and print its top N functions to stderr")
    p.add_argument("--torch-profile", type=int, default=0, metavar="N",
                   help="torch.profiler of one new batch's first step and of its repeat "
                        "(host ops and device kernels), top N rows by self CPU time, stderr")
    p.add_argument("--op-sites", type=int, default=0, metavar="N",
                   help="count the ATen ops of one new batch's block build and of its first "
                        "step beyond the repeat, by hector call site; top N sites, stderr")
    p.add_argument("--cpu-clock", action="store_true",
                   help="CPU only: time by this process's CPU time, not wall time (steadier "
                        "on a machine shared with other jobs)")
    p.add_argument("--sampling", action="store_true",
                   help="time sampling alone: the loader's and into static-capacity buffers "
                        "(eager, cut, replayed from a CUDA graph)")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="with --sampling on CUDA: the N kernels of a static replay with the "
                        "most device time (stderr)")
    p.add_argument("--epoch-prefetch", type=int, default=0, metavar="K",
                   help="time whole epochs with NeighborLoader prefetch=0 and prefetch=K "
                        "(torch backend) instead")
    args = p.parse_args()
    if args.stub_kernels:
        stub_triton_kernels()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.cpu_clock:
        if device.type != "cpu":
            raise SystemExit("--cpu-clock needs --device cpu (CPU time misses GPU waits)")
        TIMER[0] = time.process_time
    data, scale = load_profile(args, device)
    graph = data.graph
    x = torch.randn(graph.num_nodes, args.hidden, device=device)
    seeds = data.node_type_names[0] if data.node_type_names else None
    fanouts = [int(f) for f in args.fanout.split(",")]
    print(f"device={device} profile={args.profile} scale={scale} nodes={graph.num_nodes:,} "
          f"edges={graph.num_edges:,} fanout={fanouts} batch_size={args.batch_size} "
          f"threads={torch.get_num_threads()}")
    if args.epoch_prefetch:
        return epoch_prefetch(args, graph, x, seeds, fanouts, device)
    if args.sampling:
        return sampling(args, graph, seeds, fanouts, device)
    loader = NeighborLoader(graph, fanouts, input_nodes=seeds, batch_size=args.batch_size,
                            shuffle=True, seed=0)
    pyg = None
    if args.pyg:
        import torch_geometric.nn as pyg
    if args.count_syncs and device.type != "cuda":
        raise SystemExit("--count-syncs needs --device cuda")
    if args.count_syncs:
        count_triton_compiles()
    head = ("model", "edges/batch", "sample", "build", "plan", "(of it compile)", "compute",
            "(of it feature gather)", "(build+plan)/compute", "pyg compute") + (
        ("syncs build", "syncs first", "(of it backward)", "Triton compiles first") if args.count_syncs else ())
    print("| " + " | ".join(head) + " |  (ms per batch, medians)")
    print("|" + "---|" * len(head))
    for kind in args.models.split(","):
        model, refs = make_model(kind, graph, args.hidden, device, pyg)
        rows, profile = [], cProfile.Profile()
        for i, batch in zip(range(args.batches + 1), loader):
            def sample_only():
                dst = batch.seed
                for f in loader.fanouts:
                    src, _, _ = sample_hop(loader.index, dst, f, loader.generator)
                    dst = relabel(loader.index, dst, src)[0]
            t_sample, _ = clock(sample_only, device)
            t_build, blocks = clock(lambda: [rebuild(b) for b in batch.blocks], device)
            batch.blocks = blocks
            t_compile, _ = clock(lambda: [conv.program.compiled_for(b, x.dtype)
                                          for conv, b in zip(model, blocks)], device)
            compiles = COMPILES[0]
            t_first, _ = clock(lambda: step(kind, model, graph, batch, x), device)
            compiles = COMPILES[0] - compiles
            t_compute, _ = clock(lambda: step(kind, model, graph, batch, x), device)
            t_gather, _ = clock(lambda: x.index_select(0, batch.n_id), device)
            t_pyg = float("nan")
            if refs is not None:
                step(kind, refs, graph, batch, x, pyg_layers=True)     # warm-up
                t_pyg, _ = clock(lambda: step(kind, refs, graph, batch, x, pyg_layers=True),
                                 device)
            syncs = ()
            if args.count_syncs:       # fresh blocks again: their per-graph memos are empty
                again, n_build = count_syncs(lambda: [rebuild(b) for b in blocks])
                batch.blocks = again
                bwd = []             # the backward's own, counted apart (nested catch)
                _, n_first = count_syncs(lambda: step(
                    kind, model, graph, batch, x,
                    backward=lambda loss: bwd.append(count_syncs(loss.backward)[1])))
                syncs = (n_build, n_first + bwd[0], bwd[0], compiles)
            if args.cprofile and i:    # fresh blocks again, profiled apart from the timings
                again = [rebuild(b) for b in blocks]
                batch.blocks = again
                profile.enable()
                step(kind, model, graph, batch, x)
                sync(device)
                profile.disable()
            if i:                                  # batch 0 warms up (first compiles)
                rows.append((sum(b.num_edges for b in blocks), t_sample, t_build,
                             t_compile + t_first - t_compute, t_compile, t_compute, t_gather,
                             t_pyg) + syncs)
        med = [statistics.median(c) for c in zip(*rows)]
        print(f"| {kind} | {int(med[0]):,} | " + " | ".join(f"{1e3 * v:.1f}" for v in med[1:7])
              + f" | {(med[2] + med[3]) / med[5]:.2f} | {1e3 * med[7]:.1f} |"
              + "".join(f" {v:.0f} |" for v in med[8:11])
              + ("" if len(med) < 12 else   # compiles: the total, and batches with any
                 f" {sum(r[11] for r in rows)} in {sum(r[11] > 0 for r in rows)} batches |"))
        if args.torch_profile:
            torch_profile(kind, model, graph, batch, x, device, args.torch_profile)
        if args.op_sites:
            op_sites(kind, model, graph, batch, x, args.op_sites)
        if args.cprofile:
            stats = pstats.Stats(profile, stream=sys.stderr)
            print(f"--- {kind}: cProfile of the first forward+backward of {len(rows)} new "
                  "batches (totals; divide by the batch count)", file=sys.stderr)
            stats.sort_stats("tottime").print_stats(args.cprofile)
            stats.sort_stats("cumulative").print_stats(args.cprofile)


if __name__ == "__main__":
    main()
