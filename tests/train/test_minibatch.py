"""Mini-batch training: every model on blocks equals the full-graph model where sampling
keeps every neighbour, DistributedDataParallel over two gloo processes gives the gradients
of the union batch, the loop switches to mini-batches when the graph would not fit, and
``hector train --batch-size`` runs, in one process or (``train_processes``) in two."""
import argparse
import io
import re

import pytest
import torch
import torch.nn.functional as F

from hector import Graph
from hector.datasets.base import Dataset
from hector.loader import NeighborLoader
from hector.train import configure, distributed, minibatch, train, train_processes
from hector.train.defaults import MODELS
from hector.train.models import build

NUM_NODES, NUM_RELATIONS, NUM_CLASSES = 40, 3, 4


def tiny_data(features=True, seed=0, node_types=1):
    """40 nodes, 200 edges of 3 relations; with ``node_types`` 2, nodes 0-19 and 20-39 are
    two node types (blocks then order their sources by type: destinations are no prefix)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, NUM_NODES, (2, 200), generator=g)
    et = torch.randint(0, NUM_RELATIONS, (200,), generator=g)
    x = torch.randn(NUM_NODES, 6, generator=g) if features else None
    y = torch.randint(0, NUM_CLASSES, (NUM_NODES,), generator=g)
    typed = dict(node_type=torch.arange(NUM_NODES) // 20, node_type_names=["a", "b"]) \
        if node_types == 2 else {}
    return Dataset(name="tiny", edge_index=ei, num_nodes=NUM_NODES, edge_type=et,
                   num_relations=NUM_RELATIONS, x=x, y=y, train_idx=torch.arange(16),
                   test_idx=torch.arange(16, 40), num_classes=NUM_CLASSES, **typed)


def tiny_model(model, data, seed=0):
    cfg = dict(hidden=8, heads=2, dropout=0.0, num_bases=2 if model == "rgcn" else None,
               first_layer="rgcn")
    torch.manual_seed(seed)
    return build(model, data, cfg, backend="torch")


def parse(*argv):
    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(list(argv) + ["--no-progress"])


@pytest.mark.parametrize("node_types", [1, 2])
@pytest.mark.parametrize("features", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_blocks_with_every_neighbour_equal_the_full_graph(model, features, node_types):
    """Fan-out -1 keeps each seed's whole 2-hop neighbourhood: the logits of the seeds must
    be the full-graph logits' rows (every model, with features and featureless, with one
    node type and with two, where the destinations are not the first sources)."""
    data = tiny_data(features, node_types=node_types)
    net = tiny_model(model, data).eval()
    full = net(data.x, data.edge_index, data.edge_type)
    batch = next(iter(NeighborLoader(data.graph, [-1, -1], batch_size=9, shuffle=True, seed=1)))
    assert (batch.blocks[0].dst_index is not None) == (node_types == 2)
    x = None if data.x is None else data.x[batch.n_id]
    out = net(x, batch.blocks, n_id=batch.n_id)
    assert out.shape == (9, NUM_CLASSES)
    torch.testing.assert_close(out, full[batch.seed], rtol=1e-4, atol=1e-5)


def _ddp_worker(rank, world, folder, model_name="rgcn", features=True):
    distributed.init(torch.device("cpu"), rank, world)
    try:
        data = tiny_data(features)
        model = tiny_model(model_name, data)
        net = distributed.wrap(model, torch.device("cpu"))
        loader = NeighborLoader(data.graph, [-1, -1], input_nodes=data.train_idx, batch_size=4,
                                shuffle=True, seed=3, num_parts=world, part=rank)
        batch = next(iter(loader))
        x = None if data.x is None else data.x[batch.n_id]
        logits = net(x, batch.blocks, n_id=batch.n_id)
        F.cross_entropy(logits, data.y[batch.seed]).backward()
        if hasattr(net, "sync_rows"):
            net.sync_rows(batch.n_id)
        torch.save({"seed": batch.seed, "batches": len(loader), "n_id": batch.n_id,
                    "grads": {n: p.grad for n, p in model.named_parameters()},
                    "row_sparse": hasattr(net, "sync_rows")},
                   f"{folder}/rank{rank}.pt")
    finally:
        distributed.shutdown()


# rgcn with features: plain DDP; featureless rgcn (its first layer's weight and root have a
# row per node) and featureless gat (an embedding table): the tables by their touched rows.
@pytest.mark.parametrize("model_name,features,tables", [
    ("rgcn", True, ()), ("rgcn", False, ("conv1.weight", "conv1.root")),
    ("gat", False, ("embed.weight",))])
def test_two_gloo_processes_give_the_union_batch_gradients(tmp_path, model_name, features,
                                                          tables):
    distributed.spawn(_ddp_worker, 2, str(tmp_path), model_name, features)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    seeds = torch.cat([r["seed"] for r in ranks])
    assert seeds.unique().numel() == 8                     # disjoint shares of 4
    assert ranks[0]["batches"] == ranks[1]["batches"] == 2  # 16 seeds / 2 ranks / 4
    assert all(r["row_sparse"] == bool(tables) for r in ranks)
    # One process, the union batch: the mean loss over 8 seeds is the mean of the two
    # ranks' means, so its gradient is DDP's average.
    data = tiny_data(features)
    model = tiny_model(model_name, data)
    assert set(model.node_tables()) == set(tables)
    batch = NeighborLoader(data.graph, [-1, -1], input_nodes=seeds).sample(seeds)
    x = None if data.x is None else data.x[batch.n_id]
    F.cross_entropy(model(x, batch.blocks, n_id=batch.n_id), data.y[seeds]).backward()
    for name, p in model.named_parameters():
        for r in ranks:
            torch.testing.assert_close(r["grads"][name], p.grad, rtol=1e-4, atol=1e-6)
    if model_name == "rgcn" and features:
        # ...and not the gradient of one rank's batch alone.
        assert not torch.allclose(ranks[0]["grads"]["conv2.weight"],
                                  _one_rank_grad(data, ranks[0]["seed"]), rtol=1e-3)


def _captured_ddp_worker(rank, world, folder, model_name, features):
    from hector.train.captured import CapturedStep
    distributed.init(torch.device("cpu"), rank, world)
    try:
        data = tiny_data(features)
        model = tiny_model(model_name, data)
        net = distributed.wrap(model, torch.device("cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)     # (the gradients stay)
        loader = NeighborLoader(data.graph, [-1, -1], input_nodes=data.train_idx, batch_size=4,
                                shuffle=True, seed=3, num_parts=world, part=rank, static=True)
        step = CapturedStep(net, opt, loader, data.x, data.y)
        seeds, count = next(iter(loader.seed_batches()))
        step.step(seeds, count)
        torch.save({"seed": seeds[:int(count)],
                    "grads": {n: p.grad for n, p in model.named_parameters()}},
                   f"{folder}/rank{rank}.pt")
    finally:
        distributed.shutdown()


# The captured step's path with several processes (eager on the CPU): the ranks' gradients
# are the union batch's, dense ones and node tables alike, as DDP's are above.
@pytest.mark.parametrize("model_name,features", [("rgcn", True), ("rgcn", False),
                                                 ("rgat", True)])
def test_captured_step_with_two_gloo_processes_gives_the_union_batch_gradients(
        tmp_path, model_name, features):
    distributed.spawn(_captured_ddp_worker, 2, str(tmp_path), model_name, features)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    seeds = torch.cat([r["seed"] for r in ranks])
    assert seeds.unique().numel() == 8                     # disjoint shares of 4
    data = tiny_data(features)
    model = tiny_model(model_name, data)
    batch = NeighborLoader(data.graph, [-1, -1], input_nodes=seeds).sample(seeds)
    x = None if data.x is None else data.x[batch.n_id]
    F.cross_entropy(model(x, batch.blocks, n_id=batch.n_id), data.y[seeds]).backward()
    for name, p in model.named_parameters():
        for r in ranks:
            if p.grad is None:
                assert r["grads"][name] is None, name
            else:
                torch.testing.assert_close(r["grads"][name], p.grad, rtol=1e-4, atol=1e-6)


def _one_rank_grad(data, seeds):
    model = tiny_model("rgcn", data)
    batch = NeighborLoader(data.graph, [-1, -1], input_nodes=seeds).sample(seeds)
    F.cross_entropy(model(data.x[batch.n_id], batch.blocks, n_id=batch.n_id),
                    data.y[seeds]).backward()
    return model.conv2.weight.grad


def test_train_processes_returns_rank_0s_result_and_log(monkeypatch):
    # What scripts/train_seeds.py --devices 2 reads: the spawned group's rank-0 result.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = io.StringIO()
    result = train_processes(parse("--model", "gat", "--dataset", "synthetic:cora", "--epochs",
                                   "2", "--hidden", "4", "--heads", "1", "--batch-size", "64",
                                   "--fanout", "5,5", "--devices", "2", "--device", "cpu"),
                             out=out)
    text = out.getvalue()
    assert result["devices"] == 2 and result["batch_size"] == 64 and result["epochs"] == 2
    assert text.startswith("settings ") and "devices=2" in text.splitlines()[0]
    # each of the two processes took half of the CPU threads (distributed.share_cpu)
    threads = int(re.search(r"cpu_threads=(\d+)", text).group(1))
    assert threads == max(1, torch.get_num_threads() // 2)
    line = re.search(r"^RESULT .*test_acc=([0-9.]+) .*devices=2 ", text, re.M)
    assert line and float(line.group(1)) == pytest.approx(result["test_acc"], abs=5e-5)


def test_switches_to_mini_batches_when_the_graph_would_not_fit(monkeypatch):
    monkeypatch.setattr(minibatch, "free_bytes", lambda device: 10_000)
    out = io.StringIO()
    result = train(parse("--model", "gat", "--dataset", "synthetic:cora", "--epochs", "1",
                         "--hidden", "4", "--heads", "1"), out=out)
    text = out.getvalue()
    assert "training by mini-batches" in text and "sampled inference" in text
    assert result["batch_size"] == minibatch.DEFAULT_BATCH_SIZE
    assert re.search(r"RESULT .*batch_size=1024 fanout=25,20 devices=1", text)


def _estimate(model_name, edges, features=True, hidden=8, heads=2):
    from hector.compiler.memory import simulate
    from hector.train import memory
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, NUM_NODES, (2, edges), generator=g)
    et = torch.randint(0, NUM_RELATIONS, (edges,), generator=g)
    data = Dataset(name="tiny", edge_index=ei, num_nodes=NUM_NODES, edge_type=et,
                   num_relations=NUM_RELATIONS,
                   x=torch.randn(NUM_NODES, 6, generator=g) if features else None,
                   y=torch.zeros(NUM_NODES, dtype=torch.long), train_idx=torch.arange(4),
                   test_idx=torch.arange(4, 8), num_classes=NUM_CLASSES)
    cfg = dict(hidden=hidden, heads=heads, dropout=0.0, num_bases=None, first_layer="rgcn")
    net = build(model_name, data, cfg, backend="torch")
    graph = net.graph_of(data.edge_index, data.edge_type, data.num_nodes)
    need = memory.full_graph_bytes(net, graph, 6 if features else 0, hidden * heads)
    plans = [simulate(c.program.compiled_for(graph, backward=True))[0]
             for c in (net.conv1, net.conv2) if hasattr(c, "program")]
    return need, net, graph, [max(p.live for p in points) for points in plans]


@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_full_graph_estimate_holds_each_relational_plans_peak(model):
    """The estimate is made from the layers' compiled plans on the full graph: it holds the
    parameters four times (with gradients and Adam's moments), the graph's index arrays
    and each compiled layer's plan peak, and the plans hold edge-sized values, so more edges
    need more memory."""
    from hector.train import memory
    need, net, graph, peaks = _estimate(model, 200)
    assert peaks and all(p > 0 for p in peaks)
    assert need >= memory.parameter_bytes(net) + graph.nbytes() + sum(peaks)
    assert memory.parameter_bytes(net) == (memory.PARAMETER_COPIES * 4
                                           * sum(p.numel() for p in net.parameters()))
    more, _, _, more_peaks = _estimate(model, 2000)
    assert sum(more_peaks) > sum(peaks) and more > need


def test_attention_layers_estimate_no_edge_sized_arrays():
    """DF-GNN's fused kernels keep the scores on chip: a GAT model's estimate grows with the
    edges only by the graph's own index arrays."""
    need, _, graph, _ = _estimate("gat", 200)
    more, _, more_graph, _ = _estimate("gat", 2000)
    assert more - need == more_graph.nbytes() - graph.nbytes()


def test_fits_leaves_headroom_and_trusts_unknown_memory(monkeypatch):
    monkeypatch.setattr(minibatch, "free_bytes", lambda device: 1000)
    assert minibatch.fits(int(1000 * minibatch.HEADROOM), torch.device("cpu")) == (True, 1000)
    assert minibatch.fits(int(1000 * minibatch.HEADROOM) + 1, torch.device("cpu"))[0] is False
    monkeypatch.setattr(minibatch, "free_bytes", lambda device: None)
    assert minibatch.fits(10 ** 15, torch.device("cpu")) == (True, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (allocator peak)")
@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt", "gat"])
def test_full_graph_estimate_bounds_a_real_step(model):
    """On the GPU, one full-graph training step (forward, loss, backward, Adam) peaks below
    the estimate, and not far below it (the estimate is a planning bound, not a guess)."""
    from hector import datasets
    from hector.train import memory
    data = datasets.load("synthetic:aifb").to("cuda")
    x = None if data.x is None else data.x.float()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()      # the dataset: not the step's
    cfg = dict(hidden=16, heads=2, dropout=0.0, num_bases=None, first_layer="rgcn")
    net = build(model, data, cfg, backend="auto").cuda()
    graph = net.graph_of(data.edge_index, data.edge_type, data.num_nodes)
    opt = torch.optim.Adam(net.parameters())
    need = memory.full_graph_bytes(net, graph, 0 if x is None else x.shape[1], 32)
    for _ in range(2):               # the second step: Adam's moments exist
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x, graph)[data.train_idx], data.y[data.train_idx]).backward()
        opt.step()
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before   # model, graph, optimizer, step
    assert peak <= need <= 4 * peak + 64 * 2 ** 20


@pytest.mark.parametrize("model", ["rgcn", "hgt"])
def test_hector_train_batch_size_runs(model):
    out = io.StringIO()
    result = train(parse("--model", model, "--dataset", "synthetic:cora", "--epochs", "2",
                         "--hidden", "8", "--heads", "2", "--batch-size", "64",
                         "--fanout", "5,5", "--log-every", "1"), out=out)
    assert result["batch_size"] == 64 and 0.0 <= result["test_acc"] <= 1.0
    text = out.getvalue()
    assert len(re.findall(r"^epoch\s+\d+\s+loss", text, re.M)) == 2
    assert re.match(r"settings .* batch_size=64 fanout=5,5 devices=1 prefetch=0", text)


def test_prefetch_trains_the_same_model():
    """``--prefetch 2`` only builds the same batches ahead in a thread: the losses and the
    accuracy equal ``--prefetch 0``'s exactly."""
    runs = []
    for depth in ("0", "2"):
        out = io.StringIO()
        result = train(parse("--model", "rgcn", "--dataset", "synthetic:cora", "--epochs", "2",
                             "--hidden", "8", "--batch-size", "32", "--fanout", "4,3",
                             "--log-every", "1", "--prefetch", depth), out=out)
        losses = re.findall(r"^epoch\s+\d+\s+loss\s+([0-9.]+)", out.getvalue(), re.M)
        assert len(losses) == 2 and f"prefetch={depth}" in out.getvalue()
        runs.append((losses, result["test_acc"]))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("argv, option", [
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "8", "--fanout", "5"], "--fanout"),
    (["--batch-size", "8", "--fanout", "a,b"], "--fanout"),
    (["--devices", "0"], "--devices"),
    (["--batch-size", "8", "--prefetch", "-1"], "--prefetch"),
    (["--batch-size", "8", "--resume", "nowhere.pt"], "--resume"),
])
def test_bad_minibatch_options_name_the_option(argv, option):
    with pytest.raises(ValueError, match=option):
        train(parse("--model", "gat", "--dataset", "synthetic:cora", *argv), out=io.StringIO())


class _SlowLoader:
    """Batches that take ``wait`` seconds to arrive (the sampling a loader does)."""

    def __init__(self, batches, wait):
        self.batches, self.wait = batches, wait

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        import time
        for b in self.batches:
            time.sleep(self.wait)
            yield b


def test_batch_clock_splits_an_epoch_into_sampling_gathering_and_compute():
    import time
    from types import SimpleNamespace
    lin = torch.nn.Linear(6, NUM_CLASSES)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)

    def model(x_b, blocks, n_id):          # the step takes at least 30 ms
        time.sleep(0.03)
        return lin(x_b)

    x, y = torch.randn(NUM_NODES, 6), torch.randint(0, NUM_CLASSES, (NUM_NODES,))
    batches = [SimpleNamespace(n_id=torch.arange(i, i + 5), seed=torch.arange(i, i + 5),
                               blocks=[], batch_size=5) for i in (0, 10, 20)]
    clock, ticks = minibatch.BatchClock(torch.device("cpu")), []
    progress = SimpleNamespace(update=lambda n: ticks.append(n))
    loss = minibatch.train_epoch(model, opt, _SlowLoader(batches, 0.02), x, y, clock, progress)
    split = clock.seconds()
    assert split["batches"] == 3 and ticks == [1, 1, 1] and loss > 0
    assert 3 * 0.02 <= split["sample"] < 3 * 0.02 + 0.05      # the loader's waits, not more
    assert split["compute"] >= 3 * 0.03 and split["gather"] < split["sample"]
    # the loss is the mean of the batches' losses, computed from the right labels
    with torch.no_grad():
        want = sum(F.cross_entropy(lin(x[b.n_id]), y[b.seed]) for b in batches) / 3
    assert loss == pytest.approx(float(want), rel=0.2)


def test_hector_train_reports_each_phase_of_its_batches():
    out = io.StringIO()
    result = train(parse("--model", "rgcn", "--dataset", "synthetic:aifb", "--epochs", "2",
                         "--hidden", "4", "--batch-size", "64", "--fanout", "5,5",
                         "--log-every", "1"), out=out)
    text = out.getvalue()
    per = result["batch_ms"]
    assert set(per) == {"sample", "gather", "compute"} and all(v > 0 for v in per.values())
    line = re.search(r"^RESULT .* sample_ms=([0-9.]+) gather_ms=([0-9.]+) compute_ms=([0-9.]+) ",
                     text, re.M)
    assert line and float(line.group(3)) == pytest.approx(per["compute"], abs=1e-3)
    # the batches of epoch 2 fill its training step (the phases are all of it but the loss read)
    batches = int(re.search(r"^epoch +2 .*\((\d+) batches", text, re.M).group(1))
    assert batches == -(-140 // 64)     # synthetic aifb's 140 training nodes
    assert 0.7 * result["step_time"] <= batches * sum(per.values()) / 1e3 <= result["step_time"]


@pytest.mark.parametrize("device,capture,fused", [("cpu", False, None), ("cuda", False, True),
                                                  ("cuda", True, True), ("cpu", True, None)])
def test_the_optimizer_is_fused_on_cuda(device, capture, fused):
    from hector.train.loop import make_optimizer
    lin = torch.nn.Linear(3, 2)
    opt = make_optimizer(lin, dict(lr=0.1, weight_decay=0.01), torch.device(device), capture)
    assert opt.defaults["fused"] is fused
    assert opt.defaults["capturable"] is (capture and device == "cuda")
    assert opt.defaults["lr"] == 0.1 and opt.defaults["weight_decay"] == 0.01


class _Tables(torch.nn.Module):
    """Two node tables (rows on dims 0 and 1) and a plain weight."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(100, 3))
        self.stacked = torch.nn.Parameter(torch.zeros(2, 100, 4))
        self.lin = torch.nn.Linear(3, 1)

    def node_tables(self):
        return {"table": 0, "stacked": 1}

    def forward(self, x):
        return self.lin(x)


def _rank_grads(rank):
    """Rank ``rank``'s touched rows and gradients (zero outside those rows)."""
    g = torch.Generator().manual_seed(rank)
    n_id = torch.randperm(100, generator=g)[:12 + 5 * rank]
    table, stacked = torch.zeros(100, 3), torch.zeros(2, 100, 4)
    table[n_id] = torch.randn(n_id.numel(), 3, generator=g)
    stacked[:, n_id] = torch.randn(2, n_id.numel(), 4, generator=g)
    return n_id, table, stacked


def _sync_worker(rank, world, folder):
    distributed.init(torch.device("cpu"), rank, world)
    try:
        model = _Tables()
        net = distributed.wrap(model, torch.device("cpu"))
        out = {}
        n_id, table, stacked = _rank_grads(rank)
        model.table.grad, model.stacked.grad = table.clone(), stacked.clone()
        net.sync_rows(n_id)
        out["grads"] = (model.table.grad, model.stacked.grad)
        torch.save(out, f"{folder}/rank{rank}.pt")
    finally:
        distributed.shutdown()


def test_row_sparse_sync_averages_node_tables(tmp_path):
    distributed.spawn(_sync_worker, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    (_, t0, s0), (_, t1, s1) = _rank_grads(0), _rank_grads(1)
    for r in ranks:
        torch.testing.assert_close(r["grads"][0], (t0 + t1) / 2)
        torch.testing.assert_close(r["grads"][1], (s0 + s1) / 2)


def test_hgt_on_a_typed_block_builds_no_graph(monkeypatch):
    """``hector train``'s HGT (one node type over the relations) runs on a block of a typed
    graph through the block's one-type view: no Graph rebuilt from per-relation edge lists
    (a boolean mask per relation, a range check per edge array and two sorts, each a device
    sync on CUDA), and a second step on the same block reuses the view's plans."""
    data = tiny_data(True, node_types=2)
    net = tiny_model("hgt", data)
    batch = next(iter(NeighborLoader(data.graph, [5, 5], batch_size=9, seed=1)))
    built = []
    real = Graph.__init__
    monkeypatch.setattr(Graph, "__init__", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    x = data.x[batch.n_id]
    first = net(x, batch.blocks, n_id=batch.n_id)
    again = net(x, batch.blocks, n_id=batch.n_id)
    assert built == []
    torch.testing.assert_close(first, again)
    key = ("one_node_type", "n", tuple(net._meta[1]))
    views = [b._derived.get(key) for b in batch.blocks]
    assert all(v is not None and not v.is_block for v in views)


@pytest.mark.parametrize("model", ["gat", "transformer"])
def test_hector_train_runs_the_captured_step_path(model, monkeypatch):
    """The path ``hector train`` takes on CUDA for attention mini-batches (static sampling,
    capacity blocks, ``CapturedStep``, ``captured_epoch``), taken here on the CPU, where the
    step runs eagerly: it trains (the loss falls), reports, and says it captured."""
    from hector.train import loop
    monkeypatch.setattr(loop, "_capture_wanted",
                        lambda args, cfg, device, out, graph=None, world=1, **kw:
                        graph is not None)
    out = io.StringIO()
    result = train(parse("--model", model, "--dataset", "synthetic:cora", "--epochs", "3",
                         "--hidden", "8", "--heads", "2", "--batch-size", "64",
                         "--fanout", "5,5", "--log-every", "1", "--dropout", "0"), out=out)
    losses = [float(v) for v in re.findall(r"^epoch\s+\d+\s+loss\s+([0-9.]+)", out.getvalue(),
                                           re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert result["captured"] and result["batch_size"] == 64
    assert 0.0 <= result["test_acc"] <= 1.0


def _captured_train_worker(rank, world, folder):
    import json
    from hector.train import loop
    # (the CUDA choice, taken on the CPU: the captured step's path, run eagerly)
    loop._capture_wanted = lambda args, cfg, device, out, graph=None, world=1: graph is not None
    distributed.init(torch.device("cpu"), rank, world)
    try:
        out = io.StringIO()
        result = train(parse("--model", "rgcn", "--dataset", "synthetic:aifb", "--epochs", "3",
                             "--hidden", "8", "--batch-size", "32", "--fanout", "5,5",
                             "--log-every", "1", "--dropout", "0", "--devices", "2"), out=out)
        with open(f"{folder}/rank{rank}.json", "w") as f:
            json.dump({"result": result, "log": out.getvalue()}, f)
    finally:
        distributed.shutdown()


def test_hector_train_runs_the_captured_step_path_in_two_processes(tmp_path):
    """``hector train --devices 2`` on the captured mini-batch step's path: it trains (the
    loss falls), reports two devices and a captured step, and both ranks end with the same
    model (the gradients are averaged over them): the same accuracies."""
    import json
    distributed.spawn(_captured_train_worker, 2, str(tmp_path))
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for run in runs:
        assert run["result"]["captured"] and run["result"]["devices"] == 2
    losses = re.findall(r"^epoch\s+\d+\s+loss\s+([0-9.]+)", runs[0]["log"], re.M)
    assert len(losses) == 3 and float(losses[-1]) < float(losses[0])
    for key in ("train_acc", "test_acc"):
        assert runs[0]["result"][key] == runs[1]["result"][key], key


def test_static_buffers_that_would_not_fit_fall_back_to_eager_batches(monkeypatch):
    from hector.loader import static
    from hector.train import loop
    monkeypatch.setattr(loop, "_capture_wanted",
                        lambda args, cfg, device, out, graph=None, world=1, **kw:
                        graph is not None)
    monkeypatch.setattr(static, "available_bytes", lambda device: 1024)
    out = io.StringIO()
    result = train(parse("--model", "gat", "--dataset", "synthetic:cora", "--epochs", "1",
                         "--hidden", "4", "--heads", "1", "--batch-size", "64",
                         "--fanout", "5,5"), out=out)
    assert "note: mini-batch step not captured: static=True" in out.getvalue()
    assert not result["captured"] and result["batch_size"] == 64
