"""Will full-graph training fit on the device?  An estimate of one training step's peak
memory from the model's own plans, made before anything runs (``hector train`` switches to
mini-batches when it says no).

What a step holds, summed (each part an upper estimate, so their sum errs on the safe side):

* the parameters with their gradients, Adam's two moments and up to two parameter-sized
  temporaries of torch's multi-tensor Adam (6 copies; see :func:`parameter_bytes`);
* the graph's index structures (``Graph.nbytes``);
* each compiled relational layer (RGCN, RGAT, HGT): the peak of its compiled forward and
  backward plans on the full graph's row counts (:func:`hector.compiler.memory.simulate`,
  which replays the plans' allocations and frees; ``hector explain`` prints the same
  figure).  The whole peak is counted for each layer although the first layer's peak has
  passed when the second runs (what the first layer keeps for its backward is in its peak);
* each attention layer (GAT, AGNN, Transformer: DF-GNN's fused kernels keep the scores on
  chip, so nothing edge-sized): the node arrays its attention op saves and its backward
  writes, ``ATTENTION_NODE_ARRAYS`` of the layer's width plus ``ATTENTION_HEAD_ARRAYS`` of
  one value per head (the log-sum-exp, the two score terms and their gradients);
* the featureless RGCN layer: ``FEATURELESS_EDGE_ARRAYS`` edge rows (the gathered weight
  rows, the messages and their gradient);
* the activations between layers (input features, hidden rows, dropout masks and their
  gradients): ``ACTIVATION_ARRAYS`` rows of the widest of them per node.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..compiler.memory import simulate
from ..nn import AGNNConv, GATConv, TransformerConv

#: [N, width] arrays an attention layer's step holds: q, k, v and the output saved by the
#: attention op, and the four gradients its backward writes (k and v share one for GAT).
ATTENTION_NODE_ARRAYS = 8
#: [N, heads] fp32 arrays: the log-sum-exp, the source and destination score terms, their
#: gradients and the backward's row dot.
ATTENTION_HEAD_ARRAYS = 6
#: [E, width] arrays of the featureless RGCN layer.
FEATURELESS_EDGE_ARRAYS = 3
#: [N, widest] arrays between and around the layers.
ACTIVATION_ARRAYS = 6


#: Parameter-sized buffers of a step: the parameters, their gradients, Adam's two moments, and
#: the two temporaries of torch's multi-tensor (foreach) Adam, which ``hector train``'s captured
#: step uses (``capturable``): the second moments' square roots and, with weight decay, the
#: decayed gradients.  (Counting 4 let a real RGCN step on synthetic AIFB, whose featureless
#: first layer is 48 MB of parameters, peak 17% above the estimate on the H200.)
PARAMETER_COPIES = 6


def parameter_bytes(model: nn.Module) -> int:
    """Parameters, their gradients, Adam's two moments and its temporaries."""
    return PARAMETER_COPIES * sum(p.numel() * p.element_size() for p in model.parameters())


def compiled_layer_bytes(layer: nn.Module, graph, dtype: torch.dtype) -> int:
    """The peak of a compiled layer's forward + backward plans on ``graph``."""
    entry = layer.program.compiled_for(graph, dtype, backward=True)
    points, _ = simulate(entry, itemsize=dtype.itemsize)
    return max((p.live for p in points), default=0)


def attention_layer_bytes(layer: nn.Module, num_nodes: int, width: int,
                          itemsize: int) -> int:
    heads = getattr(layer, "heads", 1)
    out = getattr(layer, "out_channels", None)
    width = max(width, heads * out if out else 0)
    return num_nodes * (ATTENTION_NODE_ARRAYS * width * itemsize
                        + ATTENTION_HEAD_ARRAYS * heads * 4)


def layers_of(model: nn.Module) -> Iterable[nn.Module]:
    return [m for m in (getattr(model, "conv1", None), getattr(model, "conv2", None))
            if m is not None]


def full_graph_bytes(model: nn.Module, graph, in_width: int, hidden: int) -> int:
    """The estimated peak bytes of one full-graph training step of ``model`` (a
    :class:`hector.train.models.Net`, in the dtype it trains in) on ``graph`` (its
    ``graph_of``), with input features of ``in_width`` columns (0: featureless) and
    ``hidden`` columns per hidden row."""
    dtype = next(model.parameters()).dtype
    itemsize = dtype.itemsize
    n, e = graph.num_nodes, graph.num_edges
    total = parameter_bytes(model) + graph.nbytes()
    widest = max(in_width, hidden)
    for layer in layers_of(model):
        if hasattr(layer, "program"):
            total += compiled_layer_bytes(layer, graph, dtype)
        elif isinstance(layer, (GATConv, AGNNConv, TransformerConv)):
            total += attention_layer_bytes(layer, n, hidden, itemsize)
        else:                           # FeaturelessRGCN: rows gathered per edge
            total += FEATURELESS_EDGE_ARRAYS * e * layer.out_channels * itemsize
            widest = max(widest, layer.out_channels)
    return total + ACTIVATION_ARRAYS * n * widest * itemsize
