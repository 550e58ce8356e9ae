"""The kernels a captured mini-batch step launches, counted on the CPU by phase and by the
hector function that calls them: a proxy for a replay's GPU time where a step is hundreds
of small index kernels (each a few microseconds in a CUDA graph).

    python scripts/step_ops.py [--profile mag] [--scale 0.01] [--batch-size 64]
        [--fanout 25,20] [--model rgcn] [--phases sample,blocks] [--sites 12] [--worst]
        [--backend triton|torch] [--bytes] [--prederive]

Counts every aten op that runs a kernel (views, slices and the like are left out) while one
``StaticSampler`` batch is sampled (``sample``), its capacity blocks built on fitted
capacities (``blocks``; ``--worst``: the worst-case ones), and, with ``forward`` and
``backward`` in ``--phases``, ``hector train``'s ``--model`` network run on them (Triton
kernels under the interpreter: set ``TRITON_INTERPRET=1``, slow).  On CUDA the sampler's
Floyd table is one kernel where the torch reference here runs hundreds of ops: its line is
reported apart.  ``--bytes``: the sites by the bytes their ops' tensors hold (inputs and
outputs summed, by site and op): where a step's GPU time can go when it is not launches
(an upper bound for gathers, whose whole source table is counted).  ``--prederive``: as an
overlapped captured step runs: a step on an earlier batch's blocks first (not counted),
then the recipe derivations it made, made on this batch's blocks with the sampling
(``prederive``, counted apart: the sampling stream's), before the counted forward.
"""
import argparse
import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hector.datasets import synthetic
from hector.loader import NeighborLoader

#: aten ops that launch no kernel (views, metadata, allocation without a fill).
NO_KERNEL = {"slice", "view", "unsqueeze", "set_", "detach", "select", "expand", "alias",
             "_unsafe_view", "t", "transpose", "squeeze", "as_strided", "empty", "new_empty",
             "permute", "reshape", "_reshape_alias", "split", "chunk", "unbind", "lift_fresh",
             "empty_like", "scalar_tensor", "_local_scalar_dense", "split_with_sizes",
             "_record_function_enter_new", "_record_function_exit"}
#: The CPU stand-in of a one-kernel CUDA op (counted apart).
ONE_KERNEL_ON_CUDA = ("floyd_table_torch",)


class Count(TorchDispatchMode):
    """Kernel-launching aten ops, by the innermost hector function that called them."""

    def __init__(self):
        super().__init__()
        self.sites = collections.Counter()
        self.bytes = collections.Counter()   # (site, op): bytes of its inputs and outputs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            frames = [f for f in traceback.extract_stack() if "/hector/" in f.filename]
            site = (frames[-1].filename.split("/hector/")[-1] + ":" + frames[-1].name
                    if frames else "(outside hector)")
            self.sites[site] += 1
            tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out))
                       if isinstance(t, torch.Tensor)]
            self.bytes[(site, name)] += sum(t.numel() * t.element_size() for t in tensors)
        return out

    def total(self) -> int:
        return sum(v for k, v in self.sites.items()
                   if not k.endswith(ONE_KERNEL_ON_CUDA))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="mag")
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--fanout", default="25,20")
    p.add_argument("--model", default="rgcn")
    p.add_argument("--phases", default="sample,blocks")
    p.add_argument("--sites", type=int, default=12)
    p.add_argument("--worst", action="store_true")
    p.add_argument("--bytes", action="store_true")
    p.add_argument("--prederive", action="store_true")
    p.add_argument("--backend", default="triton", choices=("triton", "torch"),
                   help="the network's backend (torch: fast, the index building's counts "
                        "are the same, the layers' own ops are not the GPU's)")
    a = p.parse_args()
    phases = a.phases.split(",")
    data = synthetic.load(a.profile, device="cpu", scale=a.scale)
    fanout = [int(f) for f in a.fanout.split(",")]
    loader = NeighborLoader(data.graph, fanout, input_nodes=data.train_idx,
                            batch_size=a.batch_size, shuffle=True, seed=0, static=True)
    seeds = [sc for _, sc in zip(range(2), loader.seed_batches())]
    first = loader.static.sample(*seeds[0])
    caps = None if a.worst else loader.static.caps.fitted(first.sizes(), 1.25)
    counts = {}
    with Count() as counts["sample"]:
        sb = loader.static.sample(*seeds[1])
    if caps is not None and not caps.holds(sb.sizes()):
        caps = loader.static.caps.fitted(sb.sizes(), 1.25, at_least=caps)
    with Count() as counts["blocks"]:
        blocks = sb.capacity_blocks(loader.graph, caps)
    if "forward" in phases or "backward" in phases:
        from hector.train.defaults import defaults
        from hector.train.models import build
        x = torch.randn(data.graph.num_nodes, 64, generator=torch.Generator().manual_seed(0))
        data.x = x
        cfg = dict(defaults(a.model, "synthetic:" + a.profile), dropout=0.0, num_bases=None)
        net = build(a.model, data, cfg, backend=a.backend)
        n_id = sb.n_id_of(caps)
        if a.prederive:
            from hector.graph.twin import prederive
            earlier = first.capacity_blocks(loader.graph, caps)
            fn = first.n_id_of(caps)
            net(x.index_select(0, fn), earlier, n_id=fn).float().square().mean().backward()
            net.zero_grad(set_to_none=True)
            with Count() as counts["prederive"]:
                prederive(blocks, like=earlier)
            phases.append("prederive")
        with Count() as counts["forward"]:
            logits = net(x.index_select(0, n_id), blocks, n_id=n_id)
        with Count() as counts["backward"]:
            logits.float().square().mean().backward()
    print(f"profile={a.profile} scale={a.scale} batch={a.batch_size} fanout={fanout} "
          f"capacities={'worst case' if caps is None else 'fitted'}")
    for phase, c in counts.items():
        if phase not in phases:
            continue
        print(f"== {phase}: {c.total()} kernels")
        for site, n in c.sites.most_common(a.sites):
            note = "  (one kernel on CUDA)" if site.endswith(ONE_KERNEL_ON_CUDA) else ""
            print(f"  {n:5d}  {site}{note}")
        if a.bytes:
            print(f"-- {phase} by bytes ({sum(c.bytes.values()) / 1e6:.1f} MB in all)")
            for (site, op), b in c.bytes.most_common(a.sites):
                print(f"  {b / 1e6:9.2f} MB  {op:24s} {site}")


if __name__ == "__main__":
    main()
