"""Capacity blocks and the captured mini-batch step.

On the CPU: a layer on capacity blocks (every size a capacity, padding edges between sink
nodes) gives the destination rows and every parameter gradient of the same layer on the same
batch's ordinary blocks, for GAT (with and without self loops), AGNN and TransformerConv, on
both backends; the step ``CapturedStep`` captures, run eagerly, trains exactly like the
ordinary step; bad input is refused.  On CUDA: the step captured once and replayed gives the
eager step's losses and parameters, batch after batch, the short last batch included."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hector import Graph
from hector.loader import NeighborLoader
from hector.nn import AGNNConv, GATConv, TransformerConv
from hector.graph.graph import recipe_name
from hector.train.captured import CapturedInference, CapturedStep, masked_cross_entropy
from hector.train.models import Net

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import host_reads  # noqa: E402
from test_neighbor_loader import hetero_graph  # noqa: E402


def graph_with_loops(num_nodes=70, num_edges=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    ei[1, :20] = ei[0, :20]                          # some self loops to remove
    return Graph(ei, num_nodes=num_nodes)


class TwoLayers(torch.nn.Module):
    """Two layers called like ``hector train``'s networks on blocks."""

    def __init__(self, kind, backend, loops=True, f_in=6, classes=3):
        super().__init__()
        if kind == "gat":
            self.c1 = GATConv(f_in, 4, heads=2, add_self_loops=loops, backend=backend)
            self.c2 = GATConv(8, classes, heads=1, add_self_loops=loops, backend=backend)
        elif kind == "transformer":
            self.c1 = TransformerConv(f_in, 4, heads=2, backend=backend)
            self.c2 = TransformerConv(8, classes, heads=1, backend=backend)
        else:
            self.lin = torch.nn.Linear(f_in, classes)
            self.c1 = AGNNConv(backend=backend)
            self.c2 = AGNNConv(backend=backend)
        self.kind = kind

    def forward(self, x, blocks, n_id=None):
        if self.kind == "agnn":
            x = self.lin(x)
        return self.c2(torch.relu(self.c1(x, blocks[0])), blocks[1])


#: Where the Triton backend runs: the GPU, else Triton's interpreter (set by conftest).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kind,loops", [("gat", True), ("gat", False), ("agnn", True),
                                        ("transformer", True)])
def test_capacity_blocks_give_the_ordinary_blocks_results(kind, loops, backend):
    torch.manual_seed(0)
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    graph = graph_with_loops().to(device)
    x = torch.randn(graph.num_nodes, 6, device=device)
    model = TwoLayers(kind, backend, loops).to(device)
    loader = NeighborLoader(graph, [3, 2], batch_size=9, shuffle=True, seed=2, static=True)
    batches = list(loader.static_batches())
    for sb in (batches[0], batches[-1]):            # a full batch and the short last one
        batch = sb.to_batch(graph, loader.node_type_ptr, None)
        model.zero_grad()
        ref = model(x[batch.n_id], batch.blocks)
        ref.square().sum().backward()
        want = _grads(model)
        model.zero_grad()
        blocks = sb.capacity_blocks(graph)     # (kept until the backward has run)
        n = batch.batch_size
        with host_reads() as seen:
            out = model(x[sb.n_id], blocks)
            mask = (torch.arange(out.shape[0], device=device) < n)[:, None]
            torch.where(mask, out, 0.0).square().sum().backward()
        if backend == "triton":                     # what a CUDA capture needs
            assert seen == [], [(name, where) for name, _, where in seen]
        assert out.shape[0] == loader.batch_size
        torch.testing.assert_close(out[:n], ref, atol=1e-5, rtol=1e-4)
        for got, w in zip(_grads(model), want):
            torch.testing.assert_close(got, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind,backend,made", [
    ("gat", "torch", "self_loops"), ("agnn", "torch", "self_loops"),
    ("transformer", "torch", None), ("rgcn", "triton", "traversal_csr"),
    ("hgt", "torch", "one_node_type"),
    ("hgt", "triton", "one_node_type attention_sources traversal_csr"),
    ("rgat", "triton", "self_loops")])
def test_the_sampling_part_prederives_what_the_step_derived(kind, backend, made):
    """An overlapped step's sampling part (``_sample_and_build``) makes on the new blocks the
    recipe derivations the last step's blocks hold (GAT's and AGNN's twin with self loops,
    RGCN's traversal CSRs, HGT's one-type view; the Transformer's step derives none): the
    same ones, and the same logits as blocks that derive them on demand.  (Triton: under
    the interpreter.)"""
    relational = kind in ("rgcn", "hgt")
    graph = hetero_graph() if relational else graph_with_loops()
    x, y = torch.randn(graph.num_nodes, 6), torch.randint(0, 3, (graph.num_nodes,))
    torch.manual_seed(0)
    model = (relational_net(kind, graph, False, backend) if relational
             else TwoLayers(kind, backend))
    loader = NeighborLoader(graph, [3, 2], batch_size=16, shuffle=True, seed=5, static=True)
    step = CapturedStep(model, torch.optim.Adam(model.parameters()), loader, x, y)
    batches = loader.seed_batches()
    step.step(*next(batches))
    seeds, count = next(batches)
    step.seeds.copy_(seeds)
    step.count.copy_(count)
    sb, blocks, n_id = step._sample_and_build()

    def recipes(g):
        """The recipe keys ``g`` holds, and those of the graphs derived from it, by path."""
        out = set()
        for k, v in g._derived.items():
            if recipe_name(k) is not None:
                out.add((k,))
                if isinstance(v, Graph):
                    out |= {(k,) + path for path in recipes(v)}
        return out
    assert [recipes(b) for b in blocks] == [recipes(b) for b in step._blocks]
    names = {recipe_name(path[-1]) for b in blocks for path in recipes(b)}
    assert names == (set(made.split()) if made else set())
    fresh, fresh_n_id = sb.capacity_blocks(graph), sb.n_id_of(None)
    assert not any(b._derived for b in fresh)
    with torch.no_grad():
        torch.testing.assert_close(model(x[n_id], blocks, n_id=n_id),
                                   model(x[fresh_n_id], fresh, n_id=fresh_n_id))


def test_capacity_blocks_have_capacity_sizes_only():
    graph = graph_with_loops()
    loader = NeighborLoader(graph, [3, 2], batch_size=9, shuffle=True, seed=2, static=True)
    caps = loader.static.caps
    shapes = set()
    for sb in loader.static_batches():
        blocks = sb.capacity_blocks(graph)
        shapes.add(tuple((b.num_nodes, b.num_edges, b.num_dst_nodes, b.in_degree.max)
                         for b in blocks))
        for b in blocks:                  # a genuine graph: rows cover every edge
            assert int(b.csr_in.ptr[-1]) == b.num_edges
            assert int(b.csr_in.degrees().max()) <= b.in_degree.max
            assert torch.equal(b.csr_in.col.long(), b.src.long())
    assert shapes == {((caps.nodes[1], caps.edges[1], caps.dst[1], caps.width[1]),
                       (caps.nodes[0], caps.edges[0], caps.dst[0], caps.width[0]))}


def _train(step_fn, model, opt, loader, x, y, ordinary):
    losses = []
    for seeds, count in loader.seed_batches():
        if ordinary:
            sb = loader.static.sample(seeds, count)
            batch = sb.to_batch(loader.graph, loader.node_type_ptr, None)
            opt.zero_grad()
            logits = model(None if x is None else x[batch.n_id], batch.blocks,
                           n_id=batch.n_id)
            loss = F.cross_entropy(logits, y[batch.seed])
            loss.backward()
            opt.step()
        else:
            loss = step_fn(seeds, count)
        losses.append(float(loss.detach()))
    return losses


def test_the_step_trains_like_the_ordinary_one():
    graph = graph_with_loops()
    x, y = torch.randn(graph.num_nodes, 6), torch.randint(0, 3, (graph.num_nodes,))
    runs = []
    for ordinary in (True, False):
        torch.manual_seed(0)
        model = TwoLayers("gat", "torch")
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        loader = NeighborLoader(graph, [3, 2], batch_size=16, shuffle=True, seed=5,
                                static=True)
        step = CapturedStep(model, opt, loader, x, y)
        assert not step.capture                      # the CPU runs it eagerly
        losses = _train(step.step, model, opt, loader, x, y, ordinary)
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def relational_net(kind, graph, featureless, backend="torch"):
    """``hector train``'s network of ``kind`` for ``graph`` (dropout off)."""
    return Net(kind, graph.num_nodes, None if featureless else 6, 3, graph.num_relations,
               hidden=8, heads=2, dropout=0.0, num_bases=None, backend=backend)


@pytest.mark.parametrize("kind,featureless,backend", [
    ("rgcn", False, "torch"), ("rgcn", True, "torch"), ("rgat", False, "torch"),
    ("hgt", False, "torch"), ("hgt", False, "triton")])
def test_relational_step_trains_like_the_ordinary_one(kind, featureless, backend):
    # (Triton: on the GPU where there is one, else under the interpreter)
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    graph = hetero_graph().to(dev)
    x = None if featureless else torch.randn(graph.num_nodes, 6).to(dev)
    y = torch.randint(0, 3, (graph.num_nodes,)).to(dev)
    paper = torch.arange(graph.num_nodes, device=dev)[graph.node_type.long() == 1]
    runs = []
    for ordinary in (True, False):
        torch.manual_seed(0)
        model = relational_net(kind, graph, featureless, backend).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        loader = NeighborLoader(graph, [3, 2], input_nodes=paper, batch_size=16,
                                shuffle=True, seed=5, static=True)
        step = CapturedStep(model, opt, loader, x, y)
        with host_reads() as seen:
            losses = _train(step.step, model, opt, loader, x, y, ordinary)
        if backend == "triton" and not ordinary:     # what a CUDA capture needs
            assert seen == [], [(name, where) for name, _, where in seen]
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert len(runs[0][0]) > 1
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind,margin", [("gat", 1.0), ("rgcn", 1.0), ("rgat", 1.25)])
def test_fitted_capacities_train_like_the_ordinary_step_and_grow(kind, margin):
    """``fit=True``: blocks of capacities fitted to the batches seen give the ordinary
    step's losses and parameters; with no margin a later, larger batch grows them (counted),
    and every fitted block is smaller than the worst case."""
    graph = graph_with_loops() if kind == "gat" else hetero_graph()
    x, y = torch.randn(graph.num_nodes, 6), torch.randint(0, 3, (graph.num_nodes,))
    runs = []
    for ordinary in (True, False):
        torch.manual_seed(0)
        model = (TwoLayers(kind, "torch") if kind == "gat"
                 else relational_net(kind, graph, False))
        # (SGD: Adam's first steps move each parameter by about lr times the sign of its
        # gradient, so an entry that is zero in exact arithmetic and rounding noise in
        # float32 -- summed in another order over the fitted blocks' rows -- moved by lr
        # either way)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = NeighborLoader(graph, [3, 2], batch_size=16, shuffle=True, seed=5,
                                static=True)
        step = CapturedStep(model, opt, loader, x, y, fit=True, margin=margin)
        losses = _train(step.step, model, opt, loader, x, y, ordinary)
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    worst = loader.static.caps
    assert step.caps.edges[-1] < worst.edges[-1] and step.caps.nodes[-1] < worst.nodes[-1]
    if margin == 1.0:
        assert step.grown >= 1


def test_fitted_capacities_hold_what_they_were_fitted_to():
    from hector.loader.static import Capacities
    worst = Capacities.of(8, [4, 3], num_nodes=500, max_degree=40)
    sizes = [(8, 20, 25), (25, 40, 60)]
    fit = worst.fitted(sizes, 1.25)
    assert fit.holds(sizes) and not fit.holds([(8, 20, 25), (25, 51, 60)])
    assert fit.dst[0] == 8 and fit.dst[1] == fit.nodes[0]          # hops chain
    for h in range(2):
        assert fit.sinks[h] * fit.width[h] >= fit.edges[h]       # room for the padding
        assert fit.nodes[h] - fit.sinks[h] >= fit.dst[h]          # destinations are nodes
        assert fit.edges[h] <= worst.edges[h] and fit.nodes[h] <= worst.nodes[h]
    grown = worst.fitted([(8, 10, 12), (12, 90, 200)], 1.0, at_least=fit)
    assert grown.edges[0] == fit.edges[0] and grown.edges[1] == 90     # never shrinks
    assert worst.fitted([(8, 10 ** 6, 10 ** 6)] * 2, 2.0) == worst      # never above
    with pytest.raises(ValueError, match="margin"):
        worst.fitted(sizes, 0.5)


@pytest.mark.parametrize("kind", ["gat", "rgcn"])
def test_sampled_inference_gives_the_ordinary_batches_logits(kind):
    """``CapturedInference`` (eagerly on the CPU): every node's logits equal the model on
    the same batch's ordinary blocks; rows of other nodes are zero; a second call draws the
    same neighbourhoods (the sampler's seed restored, and its generator's state where it
    draws from one: the CPU without Triton's interpreter, where this test also runs)."""
    graph = graph_with_loops() if kind == "gat" else hetero_graph()
    x = torch.randn(graph.num_nodes, 6)
    torch.manual_seed(0)
    model = (TwoLayers(kind, "torch") if kind == "gat"
             else relational_net(kind, graph, False)).eval()
    nodes = torch.arange(0, graph.num_nodes, 3)
    loader = NeighborLoader(graph, [3, 2], input_nodes=nodes, batch_size=7, seed=1,
                            static=True)
    infer = CapturedInference(model, loader, x, 3)
    got = infer().clone()
    assert torch.equal(infer(), got)
    want = torch.zeros_like(got)
    twin = NeighborLoader(graph, [3, 2], input_nodes=nodes, batch_size=7, seed=1, static=True)
    with torch.no_grad():
        for seeds, count in twin.seed_batches():
            batch = twin.static.sample(seeds, count).to_batch(graph, twin.node_type_ptr,
                                                              graph.node_type_names)
            want[batch.seed] = model(x[batch.n_id], batch.blocks, n_id=batch.n_id).float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    others = torch.ones(graph.num_nodes, dtype=torch.bool)
    others[nodes] = False
    assert not got[others].any() and got[nodes].abs().sum(1).gt(0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind", ["gat", "rgcn"])
def test_captured_inference_replays_the_eager_one(kind):
    graph = (graph_with_loops(num_nodes=400, num_edges=4000) if kind == "gat"
             else hetero_graph()).to("cuda")
    x = torch.randn(graph.num_nodes, 6, device="cuda")
    torch.manual_seed(0)
    model = (TwoLayers(kind, "auto") if kind == "gat"
             else relational_net(kind, graph, False, backend="auto")).cuda().eval()
    outs = []
    for capture in (False, True):
        loader = NeighborLoader(graph, [4, 3], input_nodes=torch.arange(0, graph.num_nodes, 2,
                                device="cuda"), batch_size=12, seed=1, static=True)
        infer = CapturedInference(model, loader, x, 3, capture=capture)
        outs.append([infer().clone() for _ in range(2)])
        if capture:
            assert infer.replays == 2 * len(loader) - 2 > 0
    for got in outs[1]:
        torch.testing.assert_close(got, outs[0][0], atol=1e-4, rtol=1e-4)


def test_masked_loss_is_the_mean_over_valid_rows():
    logits, y = torch.randn(6, 4), torch.randint(0, 4, (6,))
    got = masked_cross_entropy(logits, y, torch.tensor(4))
    torch.testing.assert_close(got, F.cross_entropy(logits[:4], y[:4]))


def test_bad_input_is_refused():
    graph = graph_with_loops()
    model = TwoLayers("gat", "torch")
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(graph.num_nodes, 6), torch.zeros(graph.num_nodes, dtype=torch.long)
    with pytest.raises(ValueError, match="static=True"):
        CapturedStep(model, opt, NeighborLoader(graph, [2], batch_size=4), x, y)
    with pytest.raises(ValueError, match="CUDA"):
        CapturedStep(model, opt, NeighborLoader(graph, [2], batch_size=4, static=True), x, y,
                     capture=True)
    step = CapturedStep(model, opt, NeighborLoader(graph, [2], batch_size=4, static=True), x, y)
    with pytest.raises(ValueError, match="seeds must be a \\[batch_size=4\\]"):
        step.step(torch.arange(3), torch.tensor(3))
    with pytest.raises(ValueError, match="count must be a 0-d"):
        step.step(torch.arange(4), 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
@pytest.mark.parametrize("capturable", [True, False, "fused"])
def test_captured_step_replays_the_eager_step(kind, capturable):
    graph = graph_with_loops(num_nodes=400, num_edges=4000).to("cuda")
    x = torch.randn(graph.num_nodes, 6, device="cuda")
    y = torch.randint(0, 3, (graph.num_nodes,), device="cuda")
    _same_with_and_without_capture(lambda: TwoLayers(kind, "auto").cuda(), graph, x, y,
                                   capturable, batch_size=48)


def _same_with_and_without_capture(make_model, graph, x, y, capturable, batch_size,
                                   fit=False, overlap=None):
    """Train one epoch eagerly, then one captured (same seeds): equal losses and parameters,
    every batch after the two warm-up steps replayed (``fit``: but those whose sizes grew
    the fitted capacities, which run eagerly).  ``capturable="fused"``: torch's fused Adam
    (one kernel per group, its step count on the device) inside the graph.  ``overlap``:
    the captured step's (default: on)."""
    runs = []
    for capture in (False, True):
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=bool(capturable),
                               fused=True if capturable == "fused" else None)
        loader = NeighborLoader(graph, [4, 3], batch_size=batch_size, shuffle=True, seed=5,
                                static=True)
        step = CapturedStep(model, opt, loader, x, y, capture=capture, fit=fit,
                            margin=1.0 if fit else 1.25, overlap=overlap if capture else None)
        losses = [float(step.step(s, c)) for s, c in loader.seed_batches()]
        if capture and fit:
            assert step.replays > 0 and step.replays + step.eager_steps == len(loader)
        elif capture:
            assert step.replays == len(loader) - 2 > 0 and step.eager_steps == 2
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-4, rtol=1e-4)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind,featureless,fit,compiled,overlap", [
    ("rgcn", False, False, False, True), ("rgcn", True, False, False, True),
    ("rgat", False, False, False, True), ("hgt", False, False, False, True),
    ("rgcn", False, True, False, True), ("gat", False, True, False, True),
    ("rgcn", True, True, True, True), ("hgt", False, True, True, True),
    ("gat", False, False, True, True), ("rgcn", False, True, False, False),
    ("rgat", False, False, False, False)])
def test_relational_captured_step_replays_the_eager_step(kind, featureless, fit, compiled,
                                                         overlap, monkeypatch):
    """The relational networks' captured steps (and GAT's on fitted capacities) replay the
    eager ones; ``compiled``: with the index building through ``torch.compile``
    (``HECTOR_COMPILE_INDEX=1``) inside the captured graph; ``overlap``: the next batch
    sampled while the step runs, or not."""
    monkeypatch.setenv("HECTOR_COMPILE_INDEX", "1" if compiled else "0")
    graph = (graph_with_loops(num_nodes=400, num_edges=4000) if kind == "gat"
             else hetero_graph()).to("cuda")
    x = None if featureless else torch.randn(graph.num_nodes, 6, device="cuda")
    y = torch.randint(0, 3, (graph.num_nodes,), device="cuda")
    make = ((lambda: TwoLayers(kind, "auto").cuda()) if kind == "gat" else
            (lambda: relational_net(kind, graph, featureless, backend="auto").cuda()))
    _same_with_and_without_capture(make, graph, x, y, True, batch_size=12, fit=fit,
                                   overlap=overlap)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind,fit", [("rgcn", True), ("gat", False), ("hgt", True)])
def test_an_overlapped_epoch_trains_like_a_sequential_one(kind, fit):
    """``captured_epoch`` feeds each batch's seeds on the sampling stream, so the next batch
    is sampled and built while the GPU runs this one's step: the same mean loss and
    parameters as the captured step without the overlap, and every batch replayed but the
    warm-up ones and those that grew fitted capacities."""
    from hector.train.minibatch import captured_epoch
    graph = (graph_with_loops(num_nodes=400, num_edges=4000) if kind == "gat"
             else hetero_graph()).to("cuda")
    x = torch.randn(graph.num_nodes, 6, device="cuda")
    y = torch.randint(0, 3, (graph.num_nodes,), device="cuda")
    runs = []
    for overlap in (False, True):
        torch.manual_seed(0)
        model = (TwoLayers(kind, "auto") if kind == "gat"
                 else relational_net(kind, graph, False, backend="auto")).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
        loader = NeighborLoader(graph, [4, 3], batch_size=12, shuffle=True, seed=5,
                                static=True)
        step = CapturedStep(model, opt, loader, x, y, fit=fit, margin=1.0, overlap=overlap)
        means = [captured_epoch(step) for _ in range(2)]
        assert step.replays > 0 and step.replays + step.eager_steps == 2 * len(loader)
        runs.append((means, [p.detach().clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-4, rtol=1e-4)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_captured_epoch_returns_the_seed_weighted_mean_loss():
    from hector.train.minibatch import BatchClock, captured_epoch
    graph = graph_with_loops()
    x, y = torch.randn(graph.num_nodes, 6), torch.randint(0, 3, (graph.num_nodes,))
    means = []
    for run in range(2):
        torch.manual_seed(0)
        model = TwoLayers("gat", "torch")
        opt = torch.optim.SGD(model.parameters(), lr=0.0)     # the same model every batch
        loader = NeighborLoader(graph, [3, 2], batch_size=16, shuffle=True, seed=5,
                                static=True)
        step = CapturedStep(model, opt, loader, x, y)
        if run == 0:
            clock = BatchClock(graph.device)
            means.append(captured_epoch(step, clock))
            assert clock.seconds()["batches"] == len(loader)
        else:
            losses = [(float(step.step(s, c)), int(c)) for s, c in loader.seed_batches()]
            means.append(sum(v * n for v, n in losses) / sum(n for _, n in losses))
    assert abs(means[0] - means[1]) < 1e-6
