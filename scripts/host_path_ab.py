"""Same-process A/B of session 12's two host-path changes on new mini-batches.

    python scripts/host_path_ab.py [--device cuda] [--profile mag] [--models rgcn,rgat,hgt]
                                   [--batches 12] [--hidden 64]
    python scripts/host_path_ab.py --attention [--profile cora] [--models gat,agnn,transformer]

Per-batch timings on the GPU box drift by +-30% between runs of one script (the sampling and
block-build columns of ``batch_overhead.py``, whose code did not change, move as much), so two
trees timed one after the other cannot show a 20% change.  Here both variants run in one
process, batch by batch, in alternating order, on fresh copies of the same blocks:

* ``before``: every custom op dispatched (``hector.kernels.eager.direct`` answers False,
  ``_recorded`` None) and
  a gather-then-scatter movement CSR composed from its factors (``_through_rows`` declines);
* ``after``: the code as it is.

For each batch and variant: ``first`` = forward + backward on fresh blocks (index arrays,
movement CSRs, bins built), ``compute`` = the same step again (everything cached); ``plan`` =
first - compute.  Prints medians (ms) per model and variant, and after / before.

``--attention``: the attention layers (one layer, F=128, one head) on a whole synthetic graph
(default cora), eager forward + backward timed per variant, interleaved: their op calls record
gradients, so "after" runs each op's autograd formula around its body without the dispatcher.
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_overhead import (clock, common_arguments, load_profile, make_model,  # noqa: E402
                            rebuild, step)

from hector.compiler.steps_triton import traversal as traversal_steps  # noqa: E402
from hector.datasets import synthetic  # noqa: E402
from hector.kernels import eager  # noqa: E402
from hector.loader import NeighborLoader  # noqa: E402
from hector.nn import AGNNConv, GATConv, TransformerConv  # noqa: E402

REAL = {"direct": eager.direct, "recorded": eager._recorded,
        "through": traversal_steps._through_rows}


def use(variant: str) -> None:
    before = variant == "before"
    eager.direct = (lambda *a, **k: False) if before else REAL["direct"]
    eager._recorded = (lambda *a, **k: None) if before else REAL["recorded"]
    traversal_steps._through_rows = (lambda *a, **k: None) if before else REAL["through"]


def attention_ab(args, device):
    data = synthetic.load(args.profile, device=device, scale=args.scale or 1.0)
    g, F = data.graph, 128
    x = torch.randn(g.num_nodes, F, device=device, requires_grad=True)
    print(f"device={device} profile={args.profile} nodes={g.num_nodes:,} edges={g.num_edges:,} "
          f"(eager forward + backward, ms, medians of {args.batches})")
    print("| layer | before | after | after / before |")
    print("|---|---|---|---|")
    make = {"gat": lambda: GATConv(F, F), "agnn": lambda: AGNNConv(),
            "transformer": lambda: TransformerConv(F, F)}
    for kind in args.models.split(","):
        layer = make[kind]().to(device)
        times = {"before": [], "after": []}
        for i in range(args.batches + 2):
            for variant in (("before", "after") if i % 2 else ("after", "before")):
                use(variant)
                t, _ = clock(lambda: layer(x, g).square().mean().backward(), device)
                if i > 1:
                    times[variant].append(t)
        use("after")
        b, a = (1e3 * statistics.median(times[v]) for v in ("before", "after"))
        print(f"| {kind} | {b:.3f} | {a:.3f} | {a / b:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(p, batches=12)
    p.add_argument("--attention", action="store_true",
                   help="the attention layers on a whole graph (--profile cora by default)")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.attention:
        if args.profile == "mag":
            args.profile = "cora"
        if args.models == "rgcn,rgat,hgt":
            args.models = "gat,agnn,transformer"
        return attention_ab(args, device)
    data, _ = load_profile(args, device)
    graph = data.graph
    x = torch.randn(graph.num_nodes, args.hidden, device=device)
    loader = NeighborLoader(graph, [25, 20], input_nodes=data.node_type_names[0],
                            batch_size=1024, shuffle=True, seed=0)
    print(f"device={device} profile={args.profile} nodes={graph.num_nodes:,} "
          f"edges={graph.num_edges:,} batches={args.batches} (ms, medians)")
    print("| model | variant | first | compute | plan |")
    print("|---|---|---|---|---|")
    for kind in args.models.split(","):
        model, _ = make_model(kind, graph, args.hidden, device)
        rows = {"before": [], "after": []}
        for i, batch in zip(range(args.batches + 1), loader):
            order = ("before", "after") if i % 2 else ("after", "before")
            for variant in order:
                use(variant)
                batch.blocks = [rebuild(b) for b in batch.blocks]   # fresh: nothing cached
                t_first, _ = clock(lambda: step(kind, model, graph, batch, x), device)
                t_comp, _ = clock(lambda: step(kind, model, graph, batch, x), device)
                if i:                                 # batch 0 warms up (first compiles)
                    rows[variant].append((t_first, t_comp, t_first - t_comp))
        use("after")
        med = {v: [1e3 * statistics.median(c) for c in zip(*r)] for v, r in rows.items()}
        for v in ("before", "after"):
            print(f"| {kind} | {v} | " + " | ".join(f"{m:.2f}" for m in med[v]) + " |")
        print(f"| {kind} | after / before | " + " | ".join(
            f"{a / b:.2f}" for a, b in zip(med["after"], med["before"])) + " |")


if __name__ == "__main__":
    main()
