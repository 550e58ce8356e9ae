"""hector.explain names the registry kernels a layer launches, with cache file, config and
rendered source."""
import sys
from pathlib import Path

import torch

import hector
from hector import Graph
from hector.kernels import registry
from hector.nn import GATConv
from hector.nn.rgat import RGATConv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import random_relational  # noqa: E402


def test_attention_layer_kernels(cache):
    src = torch.arange(1, 30)
    g = Graph(torch.stack([src, torch.zeros_like(src)]), num_nodes=30)
    text = hector.explain(GATConv(8, 4, heads=2), g)
    for name in ("attention_fwd", "attention_bwd_dst", "attention_bwd_src"):
        assert f"== generated kernel {name} (" in text, name
        assert f"def {registry.entry(name).function}(" in text
    assert "segment_mm (" in text          # (the layer is its program: the projection too)
    paths = [line.split("cache: ")[1] for line in text.splitlines() if "cache: " in line]
    assert len(paths) >= 4 and all(Path(p).parent == cache and Path(p).exists() for p in paths)
    assert "config: strategy=node block_e=" in text and "the autotuner times" in text


def test_compiled_plan_kernels(cache):
    ei, et = random_relational()
    g = hector.Graph(ei, edge_type=et, num_nodes=24, num_relations=4)
    text = hector.explain(RGATConv(16, 8, 4, heads=2), g)
    assert "segment_mm (" in text and "attention_fwd (" in text and ": as above" in text
    assert "def segment_mm_kernel(" in text and "def attention_fwd_kernel(" in text
    assert "config: block_m=" in text
