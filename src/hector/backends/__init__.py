"""Backends that run plan specs without generated kernels (the torch reference)."""
from .torch_attention import dropout_keep, edge_attention_torch

__all__ = ["dropout_keep", "edge_attention_torch"]
