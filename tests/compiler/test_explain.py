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
from helpers import random_relational  # noqa: E402


def test_explain_lists_passes_decisions_and_plans():
    ei, et = random_relational()
    g = hector.Graph(ei, edge_type=et, num_nodes=24, num_relations=4)
    text = explain(RGATConv(16, 8, 4, heads=2), g)
    for needle in ("captured IR", "pass reorder", "weight @ q", "pass compact", "pass fuse",
                   "attention", "forward plan", "backward plan", "segment_mm", "edge_attention"):
        assert needle in text, needle
    text = explain(models.rgcn, g, in_dim=16, out_dim=8, num_relations=4, backward=False)
    assert "backward plan" not in text


def test_explain_rejects_bad_arguments():
    with pytest.raises(TypeError, match="graph"):
        explain(models.rgcn, "not a graph", in_dim=2, out_dim=2)


def test_cli_functions(capsys):
    args = configure(argparse.ArgumentParser()).parse_args(
        ["rgcn", "--dataset", "synthetic:aifb", "--forward-only"])
    assert run(args) == 0
    assert "forward plan" in capsys.readouterr().out
