"""TransformerConv with and without its linear reordering (``hector.nn._reorder``) on one
GPU, captured in CUDA graphs (``hector bench``'s captured peer), timed interleaved, and what
the cost model decides ("auto") on each graph.

    python scripts/reorder_ab.py --datasets synthetic:cora,synthetic:pubmed,synthetic:arxiv \
        [--features 128] [--heads 1] [--data-root DATA]

Prints one markdown row per dataset: inference and training ms written / reordered, their
ratio, and the decision.
"""
import argparse
from pathlib import Path

import torch

from hector.bench import runner, suites, timing


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", required=True)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--data-root", default=None)
    a = p.parse_args()
    dev = torch.device("cuda")
    print("| dataset | nodes | edges | written inf ms | reordered inf ms | inf ratio | "
          "written train ms | reordered train ms | train ratio | auto |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in a.datasets.split(","):
        root = (str(Path(a.data_root) / name) if a.data_root and not name.startswith("synthetic:")
                else None)
        W = suites.Workload(name, dev, root=root)
        x = W.x(a.features)
        stages, layers = {}, {}
        for mode in (False, True):
            layer = suites.own_layer("transformer", W, a.features, a.heads, "auto")
            layer.reorder = mode
            layers[mode] = layer
            call = suites.caller("transformer", layer, W, False)
            peer = suites.Peer("hector captured", layer, call, "hector",
                               extra={"captured": True})
            stages[mode] = runner._stages(peer, x)[:2]
        inf = timing.interleaved({m: stages[m][0] for m in stages}, dev, 10)
        train = timing.interleaved({m: stages[m][1] for m in stages}, dev, 10)
        auto = layers[True]
        auto.reorder = "auto"
        g = W.homogeneous_graph()
        d = auto.reordering(g)
        print(f"| {name} | {g.num_nodes} | {g.num_edges} | {inf[False]['ms']:.3f} | "
              f"{inf[True]['ms']:.3f} | {inf[False]['ms'] / inf[True]['ms']:.2f} | "
              f"{train[False]['ms']:.3f} | {train[True]['ms']:.3f} | "
              f"{train[False]['ms'] / train[True]['ms']:.2f} | "
              f"{'reorders' if d.applied else 'declines'} ({d.reason}) |", flush=True)
        del stages, layers, W
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
