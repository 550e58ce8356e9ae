"""User-facing layers with PyG-compatible signatures."""
from .agnn import AGNNConv
from .gat import GATConv
from .transformer import TransformerConv

__all__ = ["GATConv", "AGNNConv", "TransformerConv"]
