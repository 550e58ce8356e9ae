"""Where a mini-batch training step's time goes with ``--devices N``: torch.profiler over
batches of ``hector train``'s own loop parts (the loader, the model, DistributedDataParallel,
Adam) on rank 0, and the all-reduce time of the model's gradient bytes.

    python scripts/ddp_step_profile.py [--model rgcn] [--dataset synthetic:mag] [--devices 2]
                                       [--warmup 30] [--batches 10] [--top 25]
                                       [--per-batch N] [--count-syncs N]

Prints (rank 0): the model's parameter count and bytes, the median time of an all-reduce of a
buffer of that many bytes, ms per batch of the profiled batches, and the top ops by self CUDA
time and by self CPU time.  CUDA only.

``--count-syncs N``: over N batches, every synchronizing CUDA call (a host read of device
data, found by ``torch.cuda.set_sync_debug_mode``) of sampling and of the training step, by
the Python line that made it, on every rank.  With several GPUs a sync inside the step after
DDP started its all-reduces waits for the slowest rank, and stops this host from queueing
ahead of its GPU.
"""
import argparse
import statistics
import time

import torch


def worker(rank, world, args):
    from hector import datasets
    from hector.train import distributed, minibatch, resolve_config
    from hector.train.loop import make_optimizer
    from hector.train.models import build
    device = torch.device("cuda", rank)
    ctx = distributed.init(device, rank, world) if world > 1 else distributed.context()
    torch.cuda.set_device(device)
    cfg = resolve_config(argparse.Namespace(
        model=args.model, dataset=args.dataset, device="cuda", batch_size=1024,
        fanout="25,20", devices=world, seed=0))
    data = datasets.load(cfg["dataset"]).to(device)
    x = None if data.x is None else data.x.float()
    y = data.y.long()
    model = build(cfg["model"], data, cfg, backend=cfg["backend"]).to(device)
    net = distributed.wrap(model, device, cfg["model"] == "rgat") if world > 1 else model
    opt = make_optimizer(model, cfg, device)
    loader = minibatch.make_loader(data.graph, data.train_idx, cfg, ctx.rank, ctx.world)
    batches = iter(loader)

    def one(times=None):
        t0 = time.perf_counter()
        batch = next(batches)
        if times is not None:
            torch.cuda.synchronize()
            t1 = time.perf_counter()
        x_b = None if x is None else x.index_select(0, batch.n_id)
        minibatch.train_step(net, opt, batch, x_b, y[batch.seed])
        if times is not None:
            torch.cuda.synchronize()
            times.append((t1 - t0, time.perf_counter() - t1))

    for _ in range(args.warmup):
        one()
    if args.count_syncs:
        count_syncs(rank, args.count_syncs, batches, net, opt, x, y, loader)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if rank == 0:
        print(f"model {cfg['model']}: {sum(p.numel() for p in model.parameters()):,} parameters, "
              f"{nbytes / 2**20:.1f} MiB; devices {world}")
    if world > 1:
        import torch.distributed as dist
        buf, times = torch.ones(nbytes // 4, device=device), []
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"all_reduce of {nbytes / 2**20:.1f} MiB: {statistics.median(times[1:]) * 1e3:.2f} ms"
                  f" ({nbytes / statistics.median(times[1:]) / 1e9:.0f} GB/s algorithm bandwidth)")
    if args.per_batch:
        # each batch timed alone (a sync after sampling and after the step), on every rank
        times = []
        for _ in range(args.per_batch):
            one(times)
        for name, col in (("sample", 0), ("step", 1)):
            v = sorted(t[col] * 1e3 for t in times)
            q = lambda f: v[min(len(v) - 1, int(f * len(v)))]   # noqa: E731
            print(f"rank {rank} {name} ms: mean {statistics.mean(v):.2f} p10 {q(0.1):.2f} "
                  f"p50 {q(0.5):.2f} p90 {q(0.9):.2f} max {v[-1]:.2f}", flush=True)
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.batches):
            one()
        torch.cuda.synchronize()
    if rank == 0:
        print(f"{(time.perf_counter() - t0) / args.batches * 1e3:.2f} ms per batch (profiled)")
        ka = prof.key_averages()
        print(ka.table(sort_by="self_cuda_time_total", row_limit=args.top))
        print(ka.table(sort_by="self_cpu_time_total", row_limit=args.top))
    if world > 1:
        distributed.shutdown()


def count_syncs(rank, n, batches, net, opt, x, y, loader):
    """Print the synchronizing calls of ``n`` batches' sampling and steps by source line."""
    import collections
    from hector.bench.timing import cuda_syncs as watched
    from hector.train import minibatch
    totals = {"sample": collections.Counter(), "step": collections.Counter()}
    for _ in range(n):
        batch, seen = watched(lambda: next(batches))
        totals["sample"] += seen
        x_b = None if x is None else x.index_select(0, batch.n_id)
        _, seen = watched(lambda: minibatch.train_step(net, opt, batch, x_b, y[batch.seed]))
        totals["step"] += seen
    for phase, where in totals.items():
        print(f"rank {rank} {phase}: {sum(where.values()) / n:.1f} syncs per batch; "
              + ", ".join(f"{k} x{v / n:g}" for k, v in where.most_common()), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="rgcn")
    p.add_argument("--dataset", default="synthetic:mag")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--per-batch", type=int, default=0, metavar="N",
                   help="time N batches one by one on every rank (mean and percentiles)")
    p.add_argument("--count-syncs", type=int, default=0, metavar="N",
                   help="list the synchronizing calls of N batches by source line, every rank")
    args = p.parse_args()
    if args.devices > 1:
        from hector.train import distributed
        distributed.spawn(worker, args.devices, args)
    else:
        worker(0, 1, args)


if __name__ == "__main__":
    main()
