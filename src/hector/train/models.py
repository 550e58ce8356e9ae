"""The networks ``hector train`` builds: two-layer node classifiers on ``hector.nn`` layers.

Every network is called as ``net(x, edge_index, edge_type)`` and returns class logits for all
nodes; ``x`` is None for featureless (RDF) datasets, where the first layer learns one vector
per node (RGCN: exactly Schlichtkrull et al.'s one-hot input, see :class:`FeaturelessRGCN`;
the other models: an embedding table).
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..graph import Graph
from ..graph.block import dst_rows, take_rows
from ..graph.cache import cached
from ..nn import AGNNConv, GATConv, HGTConv, RGATConv, RGCNConv, TransformerConv


class FeaturelessRGCN(nn.Module):
    r"""The first RGCN layer on one-hot node features, without materialising the identity.

    With :math:`x_j = e_j`, :math:`x_j \Theta_r = \Theta_r[j]`, so the layer is
    :math:`h_i = \Theta_{root}[i] + b + \sum_r \frac{1}{|N_r(i)|}\sum_{j\in N_r(i)} \Theta_r[j]`
    with :math:`\Theta_r = \sum_b c_{rb} V_b` (basis decomposition), which is PyG's
    ``RGCNConv(num_nodes, out, R, num_bases)`` called with ``x=None``, same parameters and
    initialisation (glorot), same mean aggregation per (destination, relation).
    """

    def __init__(self, num_nodes: int, out_channels: int, num_relations: int,
                 num_bases: Optional[int] = None):
        super().__init__()
        self.num_nodes, self.out_channels = num_nodes, out_channels
        self.num_relations, self.num_bases = num_relations, num_bases
        if num_bases is not None:
            self.weight = nn.Parameter(torch.empty(num_bases, num_nodes, out_channels))
            self.comp = nn.Parameter(torch.empty(num_relations, num_bases))
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, num_nodes, out_channels))
            self.register_parameter("comp", None)
        self.root = nn.Parameter(torch.empty(num_nodes, out_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                bound = math.sqrt(6.0 / (p.size(-2) + p.size(-1)))
                nn.init.uniform_(p, -bound, bound)
        nn.init.zeros_(self.bias)

    @torch.no_grad()
    def _norm(self, dst, edge_type):
        """1 / |N_r(dst)| per edge."""
        slot = dst * self.num_relations + edge_type
        count = torch.bincount(slot, minlength=self.num_nodes * self.num_relations)
        return (1.0 / count[slot].clamp(min=1).float()).unsqueeze(1)

    def _edges(self, edge_index, edge_type):
        """(src, dst, relation, 1/|N_r(dst)|) per edge, int64 ids, built once per edge set:
        on a prebuilt ``Graph`` memoised on the graph (no lookup cost: what a captured step
        reads), on tensors through the verified build-once cache (a data-pointer key alone
        kept a stale result after an in-place edit; the check reads the device)."""
        key = ("featureless-rgcn-norm", self.num_nodes, self.num_relations)
        if isinstance(edge_index, Graph):
            g = edge_index

            def build():
                src, dst, rel = g.src.long(), g.dst.long(), g.etype.long()
                return src, dst, rel, self._norm(dst, rel)
            return g.derived(key, build)
        src, dst = edge_index[0], edge_index[1]
        return (src, dst, edge_type,
                cached((edge_index, edge_type), key, lambda: self._norm(dst, edge_type)))

    def forward(self, edge_index, edge_type: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``edge_index``: a prebuilt ``hector.Graph`` (``edge_type`` None) or ``[2, E]`` with
        ``edge_type``."""
        R, N, H = self.num_relations, self.num_nodes, self.out_channels
        if self.comp is not None:
            w = (self.comp @ self.weight.view(self.num_bases, -1)).view(R, N, H)
        else:
            w = self.weight
        src, dst, edge_type, norm = self._edges(edge_index, edge_type)
        msg = w[edge_type, src] * norm.to(w.dtype)
        out = torch.zeros(N, H, dtype=msg.dtype, device=msg.device).index_add_(0, dst, msg)
        return out + self.root + self.bias

    def forward_block(self, block, n_id: torch.Tensor) -> torch.Tensor:
        """The layer on a block of ``hector.loader`` whose source nodes have global ids
        ``n_id``: the rows of its destination nodes, in the block's destination order."""
        R, H = self.num_relations, self.out_channels
        ei, et = block.input_edge_index(), block.input_edge_type()
        n_dst = block.num_dst_nodes
        dst = dst_rows(block)
        if isinstance(dst, slice):        # destinations are the first sources
            dst_pos, dst_ids = ei[1], n_id[:n_dst]
        else:                             # several node types: through dst_index
            # Edges into a node that is no destination (a capacity block's padding edges
            # between sinks) land in a spare row of that node's, dropped at the end (one
            # spare row for all of them would pile every padding edge's atomic add on it).
            position = torch.arange(n_dst, n_dst + block.num_nodes, device=ei.device)
            position[dst] = torch.arange(n_dst, device=ei.device)
            dst_pos, dst_ids = position[ei[1]], n_id[dst]
        src = n_id[ei[0]]
        # Only the weight rows the block's edges read (one per edge, not per node).
        if self.comp is not None:
            w = torch.einsum("eb,ebh->eh", self.comp[et], self.weight[:, src].transpose(0, 1))
        else:
            w = self.weight[et, src]
        slot = dst_pos * R + et
        # (a scatter, not bincount: on CUDA bincount reads its input's maximum back to the
        # host to size its output, a sync in every mini-batch step)
        rows = n_dst if isinstance(dst, slice) else n_dst + block.num_nodes
        count = torch.zeros(rows * R, dtype=w.dtype, device=w.device).scatter_add_(
            0, slot, torch.ones_like(slot, dtype=w.dtype))
        msg = w * (1.0 / count[slot].clamp(min=1)).unsqueeze(1)
        out = torch.zeros(rows, H, dtype=msg.dtype, device=msg.device).index_add_(
            0, dst_pos, msg)
        return out[:n_dst] + self.root[dst_ids] + self.bias


class Net(nn.Module):
    """A two-layer node classifier; see :func:`build`."""

    def __init__(self, model: str, num_nodes: int, in_channels: Optional[int], num_classes: int,
                 num_relations: int, hidden: int, heads: int, dropout: float,
                 num_bases: Optional[int], backend: str, first_layer: str = "embedding",
                 num_blocks: Optional[int] = None):
        super().__init__()
        if first_layer not in ("embedding", "rgcn"):
            raise ValueError(f"first_layer must be 'embedding' or 'rgcn', got {first_layer!r}")
        self.model, self.dropout = model, dropout
        self.num_relations = num_relations
        self.featureless = in_channels is None
        H, C, R = hidden, num_classes, num_relations
        comp = dict(backend=backend)
        # block-diagonal relation weights (R-GCN's link prediction): rgcn and rgat only
        blocks = {} if num_blocks is None else dict(num_blocks=num_blocks)
        if blocks and model not in ("rgcn", "rgat"):
            raise ValueError(f"num_blocks: rgcn and rgat only, not {model}")
        self.embed = None
        # Featureless RGAT/HGT: the first message-passing layer is either the model's own
        # layer on a learned embedding table ("embedding") or RGCN's one-hot layer
        # (``FeaturelessRGCN``, "rgcn"), the second layer stays the model's own.
        self.rgcn_input = self.featureless and model in ("rgat", "hgt") and first_layer == "rgcn"
        if self.featureless and model != "rgcn" and not self.rgcn_input:
            self.embed = nn.Embedding(num_nodes, H)
            in_channels = H
        if model == "rgcn":
            self.conv1 = (FeaturelessRGCN(num_nodes, H, R, num_bases) if self.featureless else
                          RGCNConv(in_channels, H, R, num_bases=num_bases, **blocks, **comp))
            self.conv2 = RGCNConv(H, C, R, num_bases=num_bases, **blocks, **comp)
        elif model == "rgat":
            self.conv1 = (FeaturelessRGCN(num_nodes, H * heads, R, num_bases) if self.rgcn_input
                          else RGATConv(in_channels, H, R, num_bases=num_bases, heads=heads,
                                        **blocks, **comp))
            self.conv2 = RGATConv(H * heads, C, R, num_bases=num_bases, heads=1, concat=False,
                                  **blocks, **comp)
        elif model == "hgt":
            if H % heads:
                raise ValueError(f"--hidden ({H}) must be divisible by --heads ({heads}) for hgt")
            self._meta = ["n"], [("n", f"r{r}", "n") for r in range(R)]
            if self.rgcn_input:
                self.lin_in = None
                self.conv1 = FeaturelessRGCN(num_nodes, H, R, num_bases)
            else:
                self.lin_in = nn.Linear(in_channels, H)
                self.conv1 = HGTConv(H, H, self._meta, heads=heads, **comp)
            self.conv2 = HGTConv(H, H, self._meta, heads=heads, **comp)
            self.lin_out = nn.Linear(H, C)
            self._ei = None
        elif model == "gat":
            self.conv1 = GATConv(in_channels, H, heads=heads, dropout=dropout, backend=backend)
            self.conv2 = GATConv(H * heads, C, heads=1, concat=False, dropout=dropout,
                                 backend=backend)
        elif model == "agnn":
            self.lin_in = nn.Linear(in_channels, H)
            self.conv1 = AGNNConv(requires_grad=False, backend=backend)
            self.conv2 = AGNNConv(requires_grad=True, backend=backend)
            self.lin_out = nn.Linear(H, C)
        elif model == "transformer":
            self.conv1 = TransformerConv(in_channels, H, heads=heads, dropout=dropout,
                                         backend=backend)
            self.conv2 = TransformerConv(H * heads, C, heads=1, concat=False, dropout=dropout,
                                         backend=backend)
        else:
            raise ValueError(f"unknown model {model!r}")

    def node_tables(self) -> Dict[str, int]:
        """Parameters with one row per graph node, by name, with their row dimension: the
        embedding table and the featureless RGCN layer's weights.  A mini-batch reads only
        its sampled nodes' rows of them (see ``hector.train.distributed.wrap``)."""
        tables = {}
        if self.embed is not None:
            tables["embed.weight"] = 0
        if isinstance(self.conv1, FeaturelessRGCN):
            tables.update({"conv1.weight": 1, "conv1.root": 0})
        return tables

    def graph_of(self, edge_index: torch.Tensor, edge_type: Optional[torch.Tensor],
                 num_nodes: int) -> Graph:
        """The prebuilt ``hector.Graph`` that ``forward`` takes in place of ``(edge_index,
        edge_type)``: built once before training, so no step looks a graph up in a cache (a
        device read) or splits edges by relation (data-dependent sizes) -- what a captured
        step needs.  HGT's carries its layers' node type and relation names."""
        if self.model in ("gat", "agnn", "transformer"):
            return Graph(edge_index, num_nodes=num_nodes)
        if edge_type is None:
            edge_type = torch.zeros(edge_index.shape[1], dtype=torch.long,
                                    device=edge_index.device)
        names = (dict(node_type_names=self._meta[0], relation_names=self._meta[1])
                 if self.model == "hgt" else {})
        return Graph(edge_index, edge_type=edge_type, num_nodes=num_nodes,
                     num_relations=self.num_relations, **names)

    def _drop(self, x):
        return F.dropout(x, p=self.dropout, training=self.training) if self.dropout else x

    def forward(self, x, edge_index, edge_type=None, n_id=None):
        """Logits of every node (full graph), or with ``edge_index`` a list of blocks from
        ``hector.loader`` (``x``: features of the first block's sources, None when
        featureless; ``n_id``: their global ids), logits of the last block's destinations."""
        if isinstance(edge_index, list):
            return self._forward_blocks(x, edge_index, n_id)
        m = self.model
        # A prebuilt hector.Graph (``graph_of``; what a captured step reads) goes to the
        # layers as it is.
        if edge_type is None and not isinstance(edge_index, Graph):
            edge_type = torch.zeros(edge_index.shape[1], dtype=torch.long,
                                    device=edge_index.device)
        if self.embed is not None:
            x = self.embed.weight
        if m == "rgcn":
            h = (self.conv1(edge_index, edge_type) if self.featureless
                 else self.conv1(self._drop(x), edge_index, edge_type))
            h = self._drop(F.relu(h))
            return self.conv2(h, edge_index, edge_type)
        if m == "rgat":
            h = (self.conv1(edge_index, edge_type) if self.rgcn_input
                 else self.conv1(self._drop(x), edge_index, edge_type))
            h = F.elu(h)
            return self.conv2(self._drop(h), edge_index, edge_type)
        if m == "hgt":
            if isinstance(edge_index, Graph):
                ei = edge_index               # built by graph_of: HGTConv takes it as it is
            else:
                if self._ei is None or self._ei[0] is not edge_index:
                    self._ei = (edge_index, {e: edge_index[:, edge_type == r]
                                             for r, e in enumerate(self._meta[1])})
                ei = self._ei[1]
            if self.rgcn_input:
                h = F.relu(self.conv1(edge_index, edge_type))
            else:
                h = F.relu(self.lin_in(self._drop(x)))
                h = F.relu(self.conv1({"n": h}, ei)["n"])
            h = self.conv2({"n": self._drop(h)}, ei)["n"]
            return self.lin_out(self._drop(F.relu(h)))
        if m == "gat":
            h = F.elu(self.conv1(self._drop(x), edge_index))
            return self.conv2(self._drop(h), edge_index)
        if m == "agnn":
            h = F.relu(self.lin_in(self._drop(x)))
            h = self.conv2(self.conv1(h, edge_index), edge_index)
            return self.lin_out(self._drop(h))
        if m == "transformer":
            h = F.elu(self.conv1(self._drop(x), edge_index))
            return self.conv2(self._drop(h), edge_index)
        raise AssertionError(m)

    def _forward_blocks(self, x, blocks, n_id):
        m, (b1, b2) = self.model, blocks
        if self.embed is not None:
            x = self.embed.weight[n_id]
        if m in ("rgcn", "rgat") and (self.featureless if m == "rgcn" else self.rgcn_input):
            h = self.conv1.forward_block(b1, n_id)
        elif m in ("rgcn", "rgat"):
            h = self.conv1(self._drop(x), b1)
        if m == "rgcn":
            return self.conv2(self._drop(F.relu(h)), b2)
        if m == "rgat":
            return self.conv2(self._drop(F.elu(h)), b2)
        if m == "hgt":
            if self.rgcn_input:
                h = F.relu(self.conv1.forward_block(b1, n_id))
            else:
                h = F.relu(self.lin_in(self._drop(x)))
                h = F.relu(self._hgt_block(self.conv1, h, b1))
            h = self._hgt_block(self.conv2, self._drop(h), b2)
            return self.lin_out(self._drop(F.relu(h)))
        if m == "agnn":
            h = F.relu(self.lin_in(self._drop(x)))
            return self.lin_out(self._drop(self.conv2(self.conv1(h, b1), b2)))
        # gat, transformer
        h = F.elu(self.conv1(self._drop(x), b1))
        return self.conv2(self._drop(h), b2)

    def _hgt_block(self, conv, h, block):
        """HGTConv (built for one node type) on a block: the block as a graph of that one
        node type (its index arrays shared, kept on the block so that a second step on it
        plans nothing), then the block's destination rows."""
        names = self._meta[1]
        view = block.derive(("one_node_type", "n", tuple(names)))
        return take_rows(conv({"n": h}, view)["n"], dst_rows(block))


def build(model: str, data, cfg: dict, backend: str = "torch") -> Net:
    """The network for ``model`` on dataset ``data`` with settings ``cfg`` (see defaults)."""
    return Net(model, num_nodes=data.num_nodes,
               in_channels=None if data.x is None else int(data.x.shape[1]),
               num_classes=data.num_classes, num_relations=max(1, int(data.num_relations)),
               hidden=cfg["hidden"], heads=cfg["heads"], dropout=cfg["dropout"],
               num_bases=cfg["num_bases"], backend=backend,
               first_layer=cfg.get("first_layer", "embedding"))
