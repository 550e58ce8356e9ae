"""GPU check of issue 13 (torch.compile, CUDA graphs, captured training), one run on the GPU box:

1. the capture tests (tests/nn/test_cuda_graphs.py, tests/train/test_capture.py, the compile
   and custom-op tests) under pytest;
2. per layer, one training step (forward + backward): host ms / kernels / GPU ms, eager vs
   captured in a CUDA graph (GAT and Transformer Cora-sized F128, RGAT and HGT aifb-sized F64);
3. ``hector train --model gat --dataset cora``: step time captured vs eager, and a 2-layer PyG
   GAT eager step on the same data;

then a short table.

    python scripts/gpu_capture_check.py [--root DIR_WITH_cora_AND_aifb] [--skip-tests]

Without ``--root`` the synthetic profiles (synthetic:cora, synthetic:aifb) are used.
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
TESTS = ["tests/nn/test_cuda_graphs.py", "tests/train/test_capture.py",
         "tests/nn/test_compile.py", "tests/kernels/test_custom_ops.py"]
CASES = [("gat", "cora", 128), ("transformer", "cora", 128), ("rgat", "aifb", 64),
         ("hgt", "aifb", 64)]


def run_tests() -> str:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", *TESTS], cwd=REPO,
                       capture_output=True, text=True)
    print(r.stdout[-4000:], r.stderr[-2000:])
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else f"pytest rc={r.returncode}"


def dataset(name, root):
    return (str(Path(root) / name), name) if root else (None, f"synthetic:{name}")


def kernels_and_gpu_ms(fn):
    """(kernels launched, summed kernel time in ms) of one call of ``fn``."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(ks), sum(e.device_time for e in ks) / 1e3


def host_and_wall_ms(fn, calls=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / calls * 1e3


def layer_step(layer_name, ds_name, root, features):
    from hector.bench import suites
    from hector.train.capture import capture_graph
    dev = torch.device("cuda")
    path, name = dataset(ds_name, root)
    W = suites.Workload(name, dev, root=path)
    ref = suites.pyg_layer(layer_name, W, features, 1 if layer_name == "agnn" else 4)
    ours = suites.hector_layer(layer_name, ref, "triton").to(dev)
    call = suites.caller(layer_name, ours, W, pyg=False)
    x = W.x(features).detach().clone().requires_grad_()

    def eager():
        call(x).sum().backward()
    rows = {}
    host, wall = host_and_wall_ms(eager)
    rows["eager"] = (host, *kernels_and_gpu_ms(eager), wall)
    def reset():
        ours.zero_grad(set_to_none=True)
        x.grad = None
    graph, _ = capture_graph(eager, 3, reset)
    host, wall = host_and_wall_ms(graph.replay)
    rows["captured"] = (host, *kernels_and_gpu_ms(graph.replay), wall)
    return rows


def train_steps(root):
    """step ms of hector train gat/cora captured (--dropout 0: attention dropout is not
    captured yet), eager (same settings), eager with the default dropout; PyG 2-layer GAT."""
    from hector.train import configure, train
    path, name = dataset("cora", root)
    p = argparse.ArgumentParser()
    configure(p)
    base = ["--model", "gat", "--dataset", name, "--device", "cuda", "--epochs", "100",
            "--no-progress", "--log-every", "1000"] + (["--root", path] if path else [])
    res = {}
    for label, extra in (("hector captured (dropout 0)", ["--dropout", "0"]),
                         ("hector eager (dropout 0)", ["--dropout", "0", "--no-capture"]),
                         ("hector eager (default dropout)", ["--no-capture"])):
        r = train(p.parse_args(base + extra))
        res[label] = (r["step_time"] * 1e3, r["epoch_time"] * 1e3, r["captured"], r["test_acc"])
    res["PyG GAT eager"] = (pyg_gat_step_ms(name, path), None, False, None)
    return res


def pyg_gat_step_ms(name, path):
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv
    from hector import datasets
    data = datasets.load(name, root=path).to("cuda")
    x, y, idx = data.x.float(), data.y.long(), data.train_idx
    conv1 = GATConv(x.shape[1], 8, heads=8, dropout=0.6).cuda()
    conv2 = GATConv(64, data.num_classes, heads=1, concat=False, dropout=0.6).cuda()
    params = list(conv1.parameters()) + list(conv2.parameters())
    opt = torch.optim.Adam(params, lr=0.005, weight_decay=5e-4)
    ei = data.edge_index
    times = []
    for _ in range(100):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        h = F.elu(conv1(F.dropout(x, 0.6), ei))
        out = conv2(F.dropout(h, 0.6), ei)
        F.cross_entropy(out[idx], y[idx]).backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:]) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", help="folder holding cora/ and aifb/ (default: synthetic)")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_capture_check.py needs CUDA")
    summary = [] if a.skip_tests else [("tests", run_tests())]
    table = []
    for layer, ds, feats in CASES:
        try:
            for mode, (host, kernels, gpu, wall) in layer_step(layer, ds, a.root, feats).items():
                table.append(f"{layer:12} {ds:5} F{feats:<4} {mode:9} {host:8.3f} {kernels:8d} "
                             f"{gpu:8.3f} {wall:8.3f}")
        except Exception as e:  # noqa: BLE001 -- report and go on with the other layers
            table.append(f"{layer:12} {ds:5} F{feats:<4} FAILED {type(e).__name__}: {e}"[:300])
    train_rows = {} if a.skip_train else train_steps(a.root)
    print("\n== summary ==")
    for k, v in summary:
        print(f"{k}: {v}")
    print(f"{'layer':12} {'data':5} {'F':5} {'mode':9} {'host ms':>8} {'kernels':>8} "
          f"{'GPU ms':>8} {'wall ms':>8}   (one training step: forward + backward)")
    print("\n".join(table))
    if train_rows:
        print(f"\n{'hector train gat/cora':32} {'step ms':>8} {'epoch ms':>9} captured test_acc")
        for k, (step, epoch, cap, acc) in train_rows.items():
            print(f"{k:32} {step:8.3f} {epoch if epoch is not None else float('nan'):9.3f} "
                  f"{str(cap):8} {acc if acc is not None else float('nan'):.4f}")


if __name__ == "__main__":
    main()
