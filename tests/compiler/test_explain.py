"""hector.explain text and the ``hector explain`` subcommand functions."""
import argparse
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import models
from hector.compiler.explain import configure, explain, run
from hector.nn.rgat import RGATConv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, random_relational  # noqa: E402


def test_explain_lists_passes_decisions_and_plans():
    ei, et = random_relational()
    g = hector.Graph(ei, edge_type=et, num_nodes=24, num_relations=4)
    text = explain(RGATConv(16, 8, 4, heads=2), g)
    for needle in ("captured IR", "pass reorder", "weight @ q", "pass compact", "pass fuse",
                   "attention", "forward plan", "backward plan", "segment_mm", "edge_attention"):
        assert needle in text, needle
    # The backward's steps that run when the features need no gradient, by number.
    line = next(t for t in text.splitlines() if t.startswith("when the inputs need no"))
    total = int(text.split("== backward plan (")[1].split(" ")[0])
    ran = line.split("steps [")[1].split("]")[0].split(", ")
    assert 0 < len(ran) < total and f"({len(ran)} of {total})" in line
    text = explain(models.rgcn, g, in_dim=16, out_dim=8, num_relations=4, backward=False)
    assert "backward plan" not in text


def test_explain_rejects_bad_arguments():
    with pytest.raises(TypeError, match="graph"):
        explain(models.rgcn, "not a graph", in_dim=2, out_dim=2)


def test_explain_counts_the_launches_of_a_training_step():
    from hector.nn import GATConv
    ei, et = random_relational()
    # (on CUDA where there is a GPU: CPU tensors need the interpreter, set only without one)
    dev = device_for("triton")
    g = hector.Graph(ei, edge_type=et, num_nodes=24, num_relations=4).to(dev)
    layer = GATConv(16, 8, heads=2, backend="triton")
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    text = explain(layer, g, launches=True)
    section = text.split(f"== kernel launches per training step (triton backend on {dev.type}")[1]
    forward, backward = section.splitlines()[1:3]
    # the fused op's own Triton kernels are counted: one forward traversal, and a row
    # reduction plus two traversals backward
    assert forward.startswith("forward:  ") and "attention_fwd_kernel 1" in forward
    for name in ("row_dot_kernel 1", "attention_bwd_dst_kernel 1", "attention_bwd_src_kernel 1"):
        assert name in backward, backward
    assert int(backward.split()[1]) > int(forward.split()[1])
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())
    text = explain(models.rgcn, g, in_dim=16, out_dim=8, num_relations=4, launches=True)
    assert "segment_mm_kernel" in text.split("== kernel launches per training step")[1]
    assert "kernel launches" not in explain(models.rgcn, g, in_dim=16, out_dim=8,
                                            num_relations=4)


def test_cli_functions(capsys, monkeypatch):
    args = configure(argparse.ArgumentParser()).parse_args(
        ["rgcn", "--dataset", "synthetic:aifb", "--forward-only"])
    assert run(args) == 0
    out = capsys.readouterr().out
    assert "forward plan" in out and "kernel launches" not in out
    from hector import datasets
    load = datasets.load      # a small aifb profile: the count runs the layer (interpreted)
    monkeypatch.setattr(datasets, "load", lambda name, root=None, **kw: load(
        name, root=root, **{**kw, "scale": 0.01}))
    args = configure(argparse.ArgumentParser()).parse_args(
        ["rgcn", "--dataset", "synthetic:aifb", "--in-dim", "4", "--out-dim", "4"])
    assert run(args) == 0
    assert "== kernel launches per training step" in capsys.readouterr().out


@pytest.mark.parametrize("model,roles", [("gat", "('v', 'a_src', 'a_dst')"),
                                         ("agnn", "('v', 'q', 'k')"),
                                         ("transformer", "('v', 'q', 'k')")])
def test_cli_explains_an_attention_layers_program(model, roles, capsys):
    """``hector explain gat|agnn|transformer --program``: the layer's DSL program through the
    passes, fused into one attention with its backward as one operator."""
    args = configure(argparse.ArgumentParser()).parse_args(
        [model, "--dataset", "synthetic:cora", "--program", "--no-launches",
         "--in-dim", "8", "--out-dim", "4"])
    assert run(args) == 0
    out = capsys.readouterr().out
    assert f"== hector.explain: {model} (options" in out
    assert f"score + edge_softmax + aggregate -> attention -- one traversal, roles {roles}" in out
    assert "[autodiff] applied: attention backward as one operator" in out
    assert "== backward plan" in out
