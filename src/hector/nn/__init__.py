"""User-facing layers with PyG-compatible signatures."""
from .agnn import AGNNConv
from .gat import GATConv
from .hgt import HGTConv
from .kge import ComplEx, DistMult, TransE
from .rgat import RGATConv
from .rgcn import RGCNConv
from .transformer import TransformerConv

__all__ = ["RGCNConv", "RGATConv", "HGTConv", "GATConv", "AGNNConv", "TransformerConv",
           "DistMult", "TransE", "ComplEx"]
