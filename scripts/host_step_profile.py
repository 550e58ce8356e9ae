"""Where a mini-batch training step's host time goes: cProfile of repeated and of first
forward + backward steps of two hector layers on NeighborLoader blocks (CUDA).

    python scripts/host_step_profile.py rgcn,hgt        # HECTOR_AUTOTUNE=0 recommended

Synthetic mag at scale 0.2, batch 1024, fan-out 25,20, width 64 (the layers of
``scripts/batch_overhead.py``).  Prints each model's repeated-step wall time, then cProfile
tables (by own time) of 20 repeated steps and of 5 new batches' first steps.
"""
import sys, time, cProfile, pstats, torch
sys.path.insert(0, "scripts")
import batch_overhead as bo
from hector.datasets import synthetic
from hector.loader import NeighborLoader
dev = torch.device("cuda")
data = synthetic.load("mag", device=dev, scale=0.2)
graph = data.graph
x = torch.randn(graph.num_nodes, 64, device=dev)
loader = NeighborLoader(graph, [25, 20], input_nodes=data.node_type_names[0], batch_size=1024, shuffle=True, seed=0)
for kind in sys.argv[1].split(","):
    model, _ = bo.make_model(kind, graph, 64, dev, None)
    it = iter(loader)
    batch = next(it)
    for _ in range(3): bo.step(kind, model, graph, batch, x)
    torch.cuda.synchronize(); t = time.perf_counter(); n = 20
    for _ in range(n): bo.step(kind, model, graph, batch, x)
    torch.cuda.synchronize(); print(kind, "repeated step ms", 1e3 * (time.perf_counter() - t) / n, flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): bo.step(kind, model, graph, batch, x)
    torch.cuda.synchronize(); pr.disable()
    print(f"=== {kind} cProfile of {n} repeated steps, by tottime")
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    # new batches: first step, profiled
    pr = cProfile.Profile(); tt = 0
    for i in range(5):
        b = next(it); torch.cuda.synchronize(); t = time.perf_counter()
        pr.enable(); bo.step(kind, model, graph, b, x); torch.cuda.synchronize(); pr.disable()
        tt += time.perf_counter() - t
    print(f"=== {kind} cProfile of 5 first steps (incl. block index builds), {1e3*tt/5:.1f} ms each under cProfile, by tottime")
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
