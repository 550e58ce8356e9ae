"""The attention layers captured in CUDA graphs (``hector bench``'s captured peer) under the
strategy rule ("auto") and under edge-parallel schedules with a forced smallest chunk, timed
interleaved: the measurement behind ``spec.SMALL_CHUNK`` and ``plan.LONG_WALK_TILES``.

    python scripts/attention_chunk_ab.py --datasets cora,synthetic:pubmed,amazon-computers \
        --arms auto,edge:16,edge:32,edge:64,edge:128 [--cases gat:128x1,agnn:128x1] \
        [--data-root DATA]

An arm is ``auto``, ``node`` or ``edge:C`` (edge-parallel, chunks of at least C edges: the
rule's chunk is computed with ``spec.MIN_CHUNK`` and ``spec.SMALL_CHUNK`` set to C; session
30's runs, before SMALL_CHUNK existed, set MIN_CHUNK alone, which gave the same chunks).  Each arm gets its own ``Graph``
(its plans and chunk tables apart).  Prints one markdown row per (dataset, layer, shape,
mode) with microseconds per arm.  CUDA only.
"""
import argparse
from pathlib import Path

import torch

from hector.bench import runner, suites, timing
from hector.graph import Graph
from hector.kernels.attention import spec as attention_spec

CASES = ("gat:128x1", "gat:64x4", "transformer:128x1", "transformer:64x4", "agnn:128x1")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", required=True)
    p.add_argument("--arms", default="auto,edge:16,edge:32,edge:64,edge:128")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--data-root", default=None)
    a = p.parse_args()
    dev = torch.device("cuda")
    arms = a.arms.split(",")
    defaults = attention_spec.MIN_CHUNK, attention_spec.SMALL_CHUNK
    print("| dataset | layer | FxH | mode | " + " | ".join(f"{x} us" for x in arms) + " |")
    print("| --- " * (4 + len(arms)) + "|")
    for name in a.datasets.split(","):
        root = (str(Path(a.data_root) / name) if a.data_root and not name.startswith("synthetic:")
                else None)
        W = suites.Workload(name, dev, root=root)
        for case in a.cases.split(","):
            layer_name, shape = case.split(":")
            f, h = (int(v) for v in shape.split("x"))
            x = W.x(f)
            kept = {}       # everything a captured replay reads stays referenced until timed
            for arm in arms:
                strategy, _, chunk = arm.partition(":")
                attention_spec.MIN_CHUNK, attention_spec.SMALL_CHUNK = (
                    (int(chunk),) * 2 if chunk else defaults)
                g = Graph(W.edge_index, num_nodes=W.graph.num_nodes)
                layer = suites.own_layer(layer_name, W, f, h, "triton")
                layer.strategy = strategy
                if hasattr(layer, "reorder"):
                    layer.reorder = False
                peer = suites.Peer("hector captured", layer,
                                   (lambda m, gr: lambda t: m(t, gr))(layer, g), "hector",
                                   extra={"captured": True})
                kept[arm] = runner._stages(peer, x) + (g, peer)
            attention_spec.MIN_CHUNK, attention_spec.SMALL_CHUNK = defaults
            for i, mode in enumerate(("inference", "training")):
                t = timing.interleaved({arm: kept[arm][i] for arm in arms}, dev, 10)
                print(f"| {name} | {layer_name} | {shape} | {mode} | "
                      + " | ".join(f"{t[arm]['ms'] * 1000:.1f}" for arm in arms) + " |",
                      flush=True)
            del kept
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
