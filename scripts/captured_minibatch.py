"""Per-batch time of mini-batch training: hector's eager step, hector's captured step (one CUDA
graph replayed per batch: sampling, blocks, gathers, forward, loss, backward, Adam), and PyG's
layers on the same blocks; and the GPU time of the captured step's kernels.

    python scripts/captured_minibatch.py [--profile products] [--scale 1.0]
        [--models gat,agnn,transformer] [--batch-size 1024] [--fanout 25,20]
        [--batches 30] [--no-pyg] [--device cuda] [--strategy auto|node|edge]
        [--kernels N] [--features N] [--fit]

For each model (``hector train``'s two-layer network and defaults, dropout off so the runs
compare; the same seeds and shuffled order for every row), ms per batch, medians over the
batches after a warm-up:

* eager: ``NeighborLoader`` batch (sampling and the blocks' build) + ``train_step``;
* captured: ``CapturedStep`` per batch (seeds copied in, one replay), synced per batch;
* stream: the same back to back (one sync at the end), as an epoch runs them: with the
  overlap (``CapturedStep(overlap=True)``: the next batch sampled and built while the GPU
  runs this one's step); ``stream_seq``: without it;
* pyg: PyG's namesake layers (``from_pyg`` takes their parameters) on the eager path's
  blocks, forward + backward + Adam, sampling and build not counted; ``pyg_synced`` per
  batch, ``pyg_stream`` back to back; pyg / stream takes the faster of the two;
* gpu: the kernels' time of one captured replay (``torch.profiler``, device time summed);
* captured / gpu: what the host and launch gaps add; pyg / stream: the speedup.

Also the capacities against a batch's actual sizes (how much padding the replay carries);
``--kernels N``: the N kernels of a replay with the most device time (stderr);
``--strategy``: every attention layer's node- or edge-parallel choice pinned (``auto``: the
layers' rule on the blocks' statistics); ``--features N``: random node features of width
N in place of the profile's (mag has none: then both sides run two message-passing layers on
the same rows, where the featureless network would learn a node table).  Models: gat,
agnn, transformer (one node type), rgcn, rgat (any graph; PyG's RGCNConv / RGATConv),
hgt (no PyG row).  ``--fit``: the captured step on capacities fitted to the batches seen
(``CapturedStep(fit=True)``; the growths are printed).
On the CPU (no capture) only the eager rows run, on a small scale.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hector.datasets import synthetic
from hector.graph.block import dst_rows, take_rows
from hector.loader import NeighborLoader
from hector.train.captured import CapturedStep
from hector.train.defaults import defaults
from hector.train.minibatch import train_step
from hector.train.models import build


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_batch(fn, batches, device, warmup=3):
    """Median ms of ``fn(item)`` over ``batches`` after ``warmup`` items."""
    times = []
    for i, item in enumerate(batches):
        sync(device)
        t0 = time.perf_counter()
        fn(item)
        sync(device)
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times) if times else float("nan")


def throughput(fn, batches, device, warmup=3):
    """ms per batch of back-to-back ``fn(item)`` calls (one sync at the end): what an epoch
    sees when the host runs ahead of the GPU."""
    items = list(batches)
    for item in items[:warmup]:
        fn(item)
    sync(device)
    t0 = time.perf_counter()
    for item in items[warmup:]:
        fn(item)
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / max(len(items) - warmup, 1)


def fed(step):
    """``step.step`` on seeds made before the timing (and synced): declared ready on the
    step's sampling stream, as ``hector train``'s epoch makes them, so an overlapped step's
    sampling need not wait for the previous batch's step."""
    def call(sc):
        with step.feeding():
            pass
        return step.step(*sc)
    return call


def pyg_model(kind, net):
    """PyG's two layers with the hector network's parameters (or None)."""
    import torch_geometric.nn as pyg
    if kind == "gat":
        layers = [pyg.GATConv(net.conv1.in_channels, net.conv1.out_channels,
                              heads=net.conv1.heads),
                  pyg.GATConv(net.conv2.in_channels, net.conv2.out_channels,
                              heads=net.conv2.heads, concat=False)]
    elif kind == "transformer":
        layers = [pyg.TransformerConv(net.conv1.in_channels, net.conv1.out_channels,
                                      heads=net.conv1.heads),
                  pyg.TransformerConv(net.conv2.in_channels, net.conv2.out_channels,
                                      heads=net.conv2.heads, concat=False)]
    elif kind == "rgcn":
        layers = [pyg.RGCNConv(c.in_channels, c.out_channels, c.num_relations)
                  for c in (net.conv1, net.conv2)]
    elif kind == "rgat":
        layers = [pyg.RGATConv(net.conv1.in_channels, net.conv1.out_channels,
                               net.conv1.num_relations, heads=net.conv1.heads),
                  pyg.RGATConv(net.conv2.in_channels, net.conv2.out_channels,
                               net.conv2.num_relations, heads=1, concat=False)]
    elif kind == "hgt":
        lin_in, lin_out = net.lin_in, net.lin_out
        layers = [torch.nn.Linear(lin_in.in_features, lin_in.out_features)]
        layers += [pyg.HGTConv(c.in_channels, c.out_channels, net._meta, heads=c.heads)
                   for c in (net.conv1, net.conv2)]
        layers.append(torch.nn.Linear(lin_out.in_features, lin_out.out_features))
    else:
        return None
    return torch.nn.ModuleList(layers)


def pyg_items(kind, net, batches):
    """(batch, per-block inputs) pairs: HGTConv's edges per relation in PyG's hetero layout
    are split before the timing (a hetero loader would hand them over that way)."""
    if kind != "hgt":
        return [(b, None) for b in batches]
    out = []
    for b in batches:
        per_block = []
        for block in b.blocks:
            ei, et = block.input_edge_index(), block.input_edge_type()
            per_block.append({rel: ei[:, et == r] for r, rel in enumerate(net._meta[1])})
        out.append((b, per_block))
    return out


def pyg_step(kind, layers, opt, x, y, item):
    batch, edge_dicts = item
    opt.zero_grad(set_to_none=True)
    logits = pyg_forward(kind, layers, x.index_select(0, batch.n_id), batch, edge_dicts)
    F.cross_entropy(logits, y[batch.seed]).backward()
    opt.step()


def pyg_forward(kind, layers, h, batch, edge_dicts):
    """PyG's layers on the batch's blocks (each block's destination rows kept), as hector
    train's network of ``kind`` runs them: its logits."""
    if kind == "hgt":
        lin_in, conv1, conv2, lin_out = layers
        h = F.relu(lin_in(h))
        h = F.relu(take_rows(conv1({"n": h}, edge_dicts[0])["n"], dst_rows(batch.blocks[0])))
        h = take_rows(conv2({"n": h}, edge_dicts[1])["n"], dst_rows(batch.blocks[1]))
        return lin_out(F.relu(h))
    for i, (conv, block) in enumerate(zip(layers, batch.blocks)):
        args = (block.input_edge_index(),) + (
            (block.input_edge_type(),) if kind in ("rgcn", "rgat") else ())
        h = take_rows(conv(h, *args), dst_rows(block))
        if i == 0:
            h = F.elu(h)
    return h


#: name fragments -> family, first match wins (torch's and Triton's kernel names)
_FAMILIES = (("triton_", "hector/inductor Triton"), ("sort", "sort"), ("Sort", "sort"),
             ("radix", "sort"), ("scan", "scan (cumsum)"), ("Scan", "scan (cumsum)"),
             ("searchsorted", "searchsorted"), ("index_put", "index_put / scatter"),
             ("scatter", "index_put / scatter"), ("index", "gather / index"),
             ("gather", "gather / index"), ("reduce", "reduction"), ("Reduce", "reduction"),
             ("fill", "fill / memset"), ("Memset", "fill / memset"), ("copy", "copy"),
             ("Memcpy", "copy"), ("elementwise", "elementwise"), ("gemm", "GEMM"),
             ("sm90", "GEMM"), ("adam", "optimizer"), ("Adam", "optimizer"))


def kernel_family(name: str) -> str:
    """A kernel's family by its name (what a replay's time is made of)."""
    for frag, fam in _FAMILIES:
        if frag in name:
            return fam
    return "other: " + name[:60]


def gpu_ms(step, items, top=0, label=""):
    """Device time of the captured replays of ``items`` (mean per replay); with ``top`` the
    kernels with the most of it, to stderr."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for s, c in items:
            step.step(s, c)
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.self_device_time_total for e in events)
    if top:
        families: dict = {}
        for e in events:
            fam = kernel_family(e.key)
            t, n = families.get(fam, (0.0, 0))
            families[fam] = (t + e.self_device_time_total, n + e.count)
        print(f"--- {label}: device time of one replay by kernel family", file=sys.stderr)
        for fam, (t, n) in sorted(families.items(), key=lambda kv: -kv[1][0]):
            print(f"  {t / 1e3 / len(items):8.3f} ms  {n / len(items):7.1f} kernels  {fam}",
                  file=sys.stderr)
        print(f"--- {label}: kernels of {len(items)} replays by device time", file=sys.stderr)
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
            print(f"  {e.self_device_time_total / 1e3 / len(items):8.3f} ms  {e.count:5d}x  "
                  f"{e.key[:110]}", file=sys.stderr)
    return total / 1e3 / len(items)


def stream_ms(step, items) -> str:
    """Kernel time per replay on each CUDA stream (the overlapped step's sampling stream
    against its step's), and the span from the first kernel to the last: which of the two
    parts bounds a batch.  From the profiler's trace (its kernels carry their stream)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    fed_step = fed(step)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for sc in items:
            fed_step(sc)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as g:
            trace = json.load(g)
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    if not kernels:
        return "no kernels traced"
    per: dict = {}
    for e in kernels:
        t, n = per.get(e["args"].get("stream"), (0.0, 0))
        per[e["args"].get("stream")] = (t + e["dur"], n + 1)
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    k = len(items)
    return (", ".join(f"stream {s}: {t / 1e3 / k:.3f} ms in {n / k:.0f} kernels"
                      for s, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0]))
            + f"; span {span / 1e3 / k:.3f} ms a batch")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--profile", default="products")
    p.add_argument("--scale", type=float, default=None)
    p.add_argument("--models", default="gat,agnn,transformer")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanout", default="25,20")
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--no-pyg", action="store_true")
    p.add_argument("--strategy", default="auto", choices=["auto", "node", "edge"])
    p.add_argument("--kernels", type=int, default=0, metavar="N")
    p.add_argument("--features", type=int, default=0, metavar="N")
    p.add_argument("--fit", action="store_true")
    args = p.parse_args()
    device = torch.device(args.device)
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else 0.01)
    data = synthetic.load(args.profile, device=device, scale=scale)
    graph, y = data.graph, data.y.long()
    if args.features or data.x is None:
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(graph.num_nodes, args.features or 64, generator=gen, device=device)
        data.x = x
    else:
        x = data.x.float()
    fanout = [int(f) for f in args.fanout.split(",")]
    print(f"device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} "
          f"profile={args.profile} scale={scale} nodes={graph.num_nodes:,} "
          f"edges={graph.num_edges:,} batch={args.batch_size} fanout={fanout}")
    kw = dict(input_nodes=data.train_idx, batch_size=args.batch_size, shuffle=True, seed=0)
    rows = []
    for kind in args.models.split(","):
        cfg = dict(defaults(kind, "synthetic:" + args.profile), dropout=0.0, num_bases=None)
        torch.manual_seed(0)
        net = build(kind, data, cfg, backend="auto").to(device)
        for m in net.modules():
            if hasattr(m, "strategy") and args.strategy != "auto":
                m.strategy = args.strategy
        # (Adam as hector train builds it on CUDA: fused, capturable; PyG's layers get the
        # same fused Adam below)
        cuda = device.type == "cuda"
        opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"], capturable=cuda,
                               fused=True if cuda else None)
        loader = NeighborLoader(graph, fanout, **kw)
        batches = [b for _, b in zip(range(args.batches), loader)]

        def eager(batch):
            train_step(net, opt, batch, x.index_select(0, batch.n_id), y[batch.seed])
        # eager includes sampling and the build: iterate the loader inside the timing
        it = iter(loader)
        t_eager = per_batch(lambda _: eager(next(it)), range(args.batches), device)
        row = dict(model=kind, eager=t_eager)
        if device.type == "cuda":
            static = NeighborLoader(graph, fanout, static=True, **kw)
            seeds = [sc for _, sc in zip(range(args.batches), static.seed_batches())]
            seq = CapturedStep(net, opt, static, x, y, fit=args.fit, overlap=False)
            row["stream_seq"] = throughput(lambda sc: seq.step(*sc), seeds, device)
            del seq
            step = CapturedStep(net, opt, static, x, y, fit=args.fit, overlap=True)
            row["stream"] = throughput(fed(step), seeds, device)
            row["captured"] = per_batch(lambda sc: step.step(*sc), seeds, device)
            row["gpu"] = gpu_ms(step, seeds[:5], args.kernels, f"{kind} {args.strategy}")
            row["streams"] = stream_ms(step, seeds[3:11])
            sb = static.static.sample(*seeds[0])
            caps, sizes = step.caps or static.static.caps, sb.sizes()
            row["grown"] = step.grown
            row["fill"] = ", ".join(f"hop {h}: edges {e / caps.edges[h]:.0%} nodes "
                                    f"{n / caps.nodes[h]:.0%}"
                                    for h, (_, e, n) in enumerate(sizes))
        layers = None if args.no_pyg else pyg_model(kind, net)
        if layers is not None:
            layers = layers.to(device)
            popt = torch.optim.Adam(layers.parameters(), lr=cfg["lr"],
                                    fused=True if cuda else None)
            def peer(item):
                pyg_step(kind, layers, popt, x, y, item)
            items = pyg_items(kind, net, batches)
            row["pyg_synced"] = per_batch(peer, items, device)
            # back to back too, as hector's stream row runs: PyG's host time (its relation
            # loops) then overlaps its GPU work; the faster of the two is the peer's figure
            row["pyg_stream"] = throughput(peer, items, device)
            row["pyg"] = min(row["pyg_synced"], row["pyg_stream"])
        rows.append(row)
        print(row, flush=True)
    cols = ["eager", "captured", "stream_seq", "stream", "gpu", "pyg_synced", "pyg_stream"]
    print("| model | " + " | ".join(cols) + " | captured/gpu | stream_seq/stream | pyg/stream "
          "|  (ms per batch, medians)")
    print("|---" * (len(cols) + 4) + "|")
    for r in rows:
        v = dict((c, r.get(c, float("nan"))) for c in cols)
        print(f"| {r['model']} | " + " | ".join(f"{v[c]:.3f}" for c in cols)
              + f" | {v['captured'] / v['gpu']:.2f} | {v['stream_seq'] / v['stream']:.2f} | "
              f"{r.get('pyg', float('nan')) / v['stream']:.2f} |")
    for r in rows:
        if "fill" in r:
            print(f"{r['model']}: capacities filled {r['fill']}")
            print(f"{r['model']}: overlapped, back to back: {r['streams']}")


if __name__ == "__main__":
    main()
