"""Autograd functions, strategy choice and kernel launching (DESIGN.md section 2, ``runtime/``)."""
from .attention import AttentionPlan, choose_strategy, edge_attention_triton, make_plan

__all__ = ["AttentionPlan", "choose_strategy", "edge_attention_triton", "make_plan"]
