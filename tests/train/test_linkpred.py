"""``hector train --task link`` on the CPU: a short run learns (filtered test MRR well above
the untrained model's) for each encoder; the test triples are ranked once, at the end, and
filter nothing before; the RESULT line; option checks."""
import argparse
import io
import random
import re

import pytest

from hector.train import configure, train
from hector.train import linkpred


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    """A triples folder with structure to learn: 'same' joins entities of one of three
    clusters, 'link' the first cluster to the second (both ways)."""
    root = tmp_path_factory.mktemp("kg")
    rnd = random.Random(1)
    triples = set()
    for _ in range(400):
        c = rnd.randrange(3)
        a, b = rnd.sample(range(c * 10, c * 10 + 10), 2)
        triples.add((a, "same", b))
    for _ in range(150):
        a, b = rnd.randrange(0, 10), rnd.randrange(10, 20)
        triples.update({(a, "link", b), (b, "link", a)})
    triples = sorted(triples)
    rnd.shuffle(triples)
    v = len(triples) // 10
    splits = {"train": triples[:-2 * v], "valid": triples[-2 * v:-v], "test": triples[-v:]}
    for name, rows in splits.items():
        (root / f"{name}.txt").write_text("".join(f"e{h}\t{r}\te{t}\n" for h, r, t in rows))
    return root


def run(argv):
    p = argparse.ArgumentParser()
    configure(p)
    out = io.StringIO()
    return train(p.parse_args(argv + ["--no-progress"]), out=out), out.getvalue()


# (--fanout: the encoder on sampled neighbourhoods of each batch's entities; --num-blocks:
# block-diagonal relation weights)
@pytest.mark.parametrize("model, more", [
    ("rgcn", []), ("rgat", []), ("hgt", []), ("rgcn", ["--fanout", "4,3", "--batch-size", "200"]),
    ("hgt", ["--fanout", "4,3", "--batch-size", "200"]), ("rgcn", ["--num-blocks", "4"]),
    ("rgcn", ["--edge-dropout", "0.4"])])
def test_a_short_run_learns(kg, model, more):
    base = ["--task", "link", "--model", model, "--dataset", "triples", "--root", str(kg),
            "--hidden", "16", "--eval-every", "50"] + more
    untrained, _ = run(base + ["--epochs", "1"])
    trained, text = run(base + ["--epochs", "300"])
    assert trained["mrr"] > 1.5 * untrained["mrr"], (untrained, trained)
    assert trained["hits10"] > untrained["hits10"] and trained["hits1"] > untrained["hits1"]
    line = [ln for ln in text.splitlines() if ln.startswith("RESULT ")][-1]
    for key in ("task=link", f"model={model}", "decoder=distmult", "mrr=", "hits1=", "hits3=",
                "hits10=", "epoch_time="):
        assert key in line
    assert re.search(r"mrr=([0-9.]+)", line).group(1) == f"{trained['mrr']:.4f}"


def test_test_triples_are_ranked_once_at_the_end(kg, monkeypatch):
    calls = []
    real = linkpred.link_metrics

    def spy(entity, decoder, triples, known, **kw):
        calls.append((triples.shape[1], known.by_tail.numel()))
        return real(entity, decoder, triples, known, **kw)
    monkeypatch.setattr(linkpred, "link_metrics", spy)
    run(["--task", "link", "--model", "rgcn", "--dataset", "triples", "--root", str(kg),
         "--hidden", "8", "--epochs", "4", "--eval-every", "2"])
    sizes = {s: len((kg / f"{s}.txt").read_text().splitlines())
             for s in ("train", "valid", "test")}
    assert calls[:-1] == [(sizes["valid"], sizes["train"] + sizes["valid"])] * 2
    assert calls[-1] == (sizes["test"], sum(sizes.values()))


def test_checkpoint_holds_the_best_model(kg, tmp_path):
    import torch
    path = tmp_path / "sub" / "best.pt"
    result, _ = run(["--task", "link", "--model", "rgcn", "--dataset", "triples", "--root",
                     str(kg), "--hidden", "8", "--epochs", "6", "--eval-every", "2",
                     "--checkpoint", str(path)])
    state = torch.load(path, weights_only=True)
    assert state["best"]["epoch"] == result["best_epoch"]
    assert state["best"]["mrr"] == result["val_mrr"] and state["epoch"] == 6
    assert state["config"]["model"] == "rgcn" and state["config"]["task"] == "link"
    assert state["best"]["model"]["embed"]["weight"].shape[1] == 8
    assert set(state["model"]) == {"embed", "encoder", "decoder"}


LINK = ["--task", "link", "--dataset", "triples", "--hidden", "8", "--eval-every", "2",
        "--dropout", "0.3"]


@pytest.mark.parametrize("model, more", [("rgcn", []), ("hgt", []),
                                         ("rgcn", ["--fanout", "3,3", "--batch-size", "300"])])
def test_resume_continues_as_one_run(kg, tmp_path, model, more):
    base = LINK + ["--root", str(kg), "--model", model] + more
    whole, whole_text = run(base + ["--epochs", "6"])
    path = tmp_path / "run.pt"
    run(base + ["--epochs", "4", "--checkpoint", str(path)])
    resumed, text = run(base + ["--epochs", "6", "--resume", str(path)])
    assert "resumed from" in text and "at epoch 4" in text
    for key in ("mrr", "hits1", "hits10", "val_mrr", "best_epoch", "epochs"):
        assert resumed[key] == whole[key], key
    losses = [ln.split()[3] for ln in whole_text.splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[3] for ln in text.splitlines() if ln.startswith("epoch ")] == losses[2:]


def test_resume_refuses_what_does_not_fit(kg, tmp_path):
    path = tmp_path / "run.pt"
    base = LINK + ["--root", str(kg), "--model", "rgcn"]
    run(base + ["--epochs", "2", "--checkpoint", str(path)])
    with pytest.raises(ValueError, match="hidden=8, not 16"):
        run(LINK[:-4] + ["--hidden", "16", "--root", str(kg), "--model", "rgcn",
                         "--epochs", "4", "--eval-every", "2", "--resume", str(path)])
    with pytest.raises(ValueError, match="at epoch 2 already"):
        run(base + ["--epochs", "2", "--resume", str(path)])
    with pytest.raises(ValueError, match="a --task link checkpoint, not --task node"):
        run(["--model", "rgcn", "--dataset", "synthetic:aifb", "--epochs", "3",
             "--resume", str(path)])


def test_node_classification_refuses_link_options():
    with pytest.raises(ValueError, match="--negatives applies to --task link only"):
        run(["--model", "rgcn", "--dataset", "synthetic:aifb", "--negatives", "3"])
    with pytest.raises(ValueError, match="--edge-dropout applies to --task link only"):
        run(["--model", "rgcn", "--dataset", "synthetic:aifb", "--edge-dropout", "0.2"])


def test_edge_dropout_keeps_a_seeded_part_of_the_triples_both_ways():
    import torch
    gen = torch.Generator().manual_seed(0)
    T, R, p = 20000, 5, 0.4
    train = torch.stack([torch.randint(0, 1000, (T,), generator=gen),
                         torch.randint(0, R, (T,), generator=gen),
                         torch.randint(0, 1000, (T,), generator=gen)])
    ei, et = linkpred.dropped_edges(train, R, p, torch.Generator().manual_seed(7))
    kept = ei.shape[1] // 2
    assert ei.shape[1] == et.numel() == 2 * kept
    assert abs(kept / T - (1 - p)) < 0.02
    fwd, inv = ei[:, :kept], ei[:, kept:]
    assert torch.equal(inv, fwd.flip(0)) and torch.equal(et[kept:], et[:kept] + R)
    # the kept edges are training triples, each at most once
    keys = set(map(tuple, train.t().tolist()))
    got = list(zip(fwd[0].tolist(), et[:kept].tolist(), fwd[1].tolist()))
    assert set(got) <= keys
    same, _ = linkpred.dropped_edges(train, R, p, torch.Generator().manual_seed(7))
    other, _ = linkpred.dropped_edges(train, R, p, torch.Generator().manual_seed(8))
    assert torch.equal(same, ei) and not torch.equal(other, ei)
    everything, _ = linkpred.dropped_edges(train, R, 0.0, torch.Generator().manual_seed(7))
    assert torch.equal(everything, linkpred.encoder_edges(train, R)[0])


def test_edge_dropout_changes_the_encoder_graph_each_epoch_but_not_evaluation(kg, monkeypatch):
    sizes = []
    real = linkpred.dropped_edges

    def spy(train, r, p, gen):
        out = real(train, r, p, gen)
        sizes.append((train.shape[1], out[0].shape[1], out[0].sum().item()))
        return out
    monkeypatch.setattr(linkpred, "dropped_edges", spy)
    run(["--task", "link", "--model", "rgcn", "--dataset", "triples", "--root", str(kg),
         "--hidden", "8", "--epochs", "4", "--eval-every", "2", "--edge-dropout", "0.5"])
    assert len(sizes) == 4                          # one draw per epoch
    assert all(kept < 2 * T for T, kept, _ in sizes)
    assert len({checksum for _, _, checksum in sizes}) > 1     # another part each epoch


@pytest.mark.parametrize("decay", [None, 0.5])
def test_lr_decay_scales_the_rate_at_each_evaluation_without_a_new_best(kg, monkeypatch, decay):
    # validation MRR by evaluation: a best, two worse, a new best, one worse
    mrrs = iter([0.3, 0.2, 0.1, 0.4, 0.35])
    real = linkpred._evaluate

    def scripted(*a, **kw):
        out = real(*a, **kw)
        return dict(out, mrr=next(mrrs)) if a[7] == "validation" else out
    rates = []
    real_epoch = linkpred.link_epoch

    def epoch_spy(encode, decoder, opt, *a):
        rates.append(opt.param_groups[0]["lr"])
        return real_epoch(encode, decoder, opt, *a)
    monkeypatch.setattr(linkpred, "_evaluate", scripted)
    monkeypatch.setattr(linkpred, "link_epoch", epoch_spy)
    more = [] if decay is None else ["--lr-decay", str(decay)]
    run(["--task", "link", "--model", "rgcn", "--dataset", "triples", "--root", str(kg),
         "--hidden", "8", "--epochs", "5", "--eval-every", "1", "--patience", "9",
         "--lr", "0.01"] + more)
    f = 1.0 if decay is None else decay
    # the rate each epoch uses: scaled after evaluations 2 and 3 (and 5, the last)
    assert rates == pytest.approx([0.01, 0.01, 0.01 * f, 0.01 * f * f, 0.01 * f * f])


@pytest.mark.parametrize("argv, match", [
    (["--model", "gat"], "--model must be one of rgcn, rgat, hgt"),
    (["--model", "rgcn", "--decoder", "complex", "--hidden", "7"], "even --hidden"),
    (["--model", "rgcn", "--negatives", "0"], "--negatives must be a positive integer"),
    (["--model", "rgcn", "--dataset", "synthetic:cora"], "holds no triples"),
    (["--model", "rgcn", "--resume", "missing.pt"], "--resume missing.pt: no such file"),
    (["--model", "rgcn", "--fanout", "5"], "--fanout needs one int"),
    (["--model", "rgcn", "--clip", "-1"], "--clip >= 0"),
    (["--model", "rgcn", "--num-blocks", "3", "--hidden", "16"], "must divide --hidden"),
    (["--model", "hgt", "--num-blocks", "2"], "rgcn's and rgat's, not hgt's"),
    (["--model", "rgcn", "--num-blocks", "0"], "--num-blocks must be a positive integer"),
    (["--model", "rgcn", "--dtype", "bf16"], "fp32 only"),
    (["--model", "rgcn", "--edge-dropout", "1"], r"--edge-dropout must be in \[0, 1\)"),
    (["--model", "rgcn", "--edge-dropout", "-0.1"], r"--edge-dropout must be in \[0, 1\)"),
    (["--model", "rgcn", "--lr-decay", "0"], r"--lr-decay must be in \(0, 1\]"),
    (["--model", "rgcn", "--lr-decay", "1.5"], r"--lr-decay must be in \(0, 1\]"),
    (["--model", "rgcn", "--edge-dropout", "0.2", "--fanout", "3,3"],
     "--edge-dropout applies to the full-graph encoder"),
])
def test_bad_options_name_the_option(kg, argv, match):
    base = ["--task", "link", "--dataset", "triples", "--root", str(kg), "--epochs", "1"]
    if "--dataset" in argv:
        base = ["--task", "link", "--epochs", "1"]
    with pytest.raises(ValueError, match=match):
        run(base + argv)


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_link_epoch_clips_the_gradient_norm(clip):
    import torch
    from hector.nn import DistMult
    torch.manual_seed(0)
    n, dim = 30, 8
    table = torch.nn.Parameter(torch.randn(n, dim) * 3)
    decoder = DistMult(2, dim)
    opt = torch.optim.SGD([table, *decoder.parameters()], lr=0.1)
    norms = []
    real_step = opt.step

    def step(*a, **kw):      # the gradients' total norm where the optimizer reads them
        norms.append(float(torch.cat([p.grad.reshape(-1) for g in opt.param_groups
                                      for p in g["params"]]).norm()))
        return real_step(*a, **kw)
    opt.step = step
    train = torch.stack([torch.randint(0, n, (40,)), torch.randint(0, 2, (40,)),
                         torch.randint(0, n, (40,))])
    linkpred.link_epoch(linkpred.whole_graph(lambda: table * 1.0), decoder, opt, train, n, 2,
                        0.01, 10, torch.Generator().manual_seed(0), clip)
    assert len(norms) == 4
    if clip:
        assert max(norms) <= clip * 1.001
    else:
        assert min(norms) > 1e-2         # (unclipped: far above the other case's bound)


@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_sampled_encoder_with_every_neighbour_is_the_whole_graph(model):
    """With fan-out -1 (every neighbour) the sampled encoder gives each asked entity the row
    the whole-graph encoder gives it (repeated ids included)."""
    import torch
    from hector import Graph
    from hector.loader import NeighborLoader
    from hector.train.models import Net
    torch.manual_seed(0)
    n, r, h = 40, 3, 8
    src, dst = torch.randint(0, n, (2, 160))
    rel = torch.randint(0, r, (160,))
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
    edge_type = torch.cat([rel, rel + r])
    net = Net(model, n, h, h, 2 * r, h, 1, 0.0, None, "torch").eval()
    embed = torch.nn.Embedding(n, h)
    graph = net.graph_of(edge_index, edge_type, n)
    ids = torch.tensor([5, 0, 17, 5, 39, 22, 0])
    whole, _ = linkpred.whole_graph(lambda: net(embed.weight, graph))(ids)
    loader = NeighborLoader(Graph(edge_index, edge_type=edge_type, num_nodes=n,
                                  num_relations=2 * r), [-1, -1], seed=0)
    rows, table = linkpred.sampled(net, embed, loader)(ids)
    torch.testing.assert_close(rows, whole, rtol=1e-5, atol=1e-5)
    assert table.shape == (5, h)            # each distinct entity once


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
def test_num_blocks_makes_block_diagonal_relation_weights(model):
    from hector.train.models import Net
    net = Net(model, 10, 16, 16, 3, 16, 1, 0.0, None, "torch", num_blocks=4)
    for conv in (net.conv1, net.conv2):
        assert conv.num_blocks == 4 and conv.weight.shape == (3, 4, 4, 4)
