"""The inter-operator IR (DESIGN.md section 2, ``ir/``)."""
from .nodes import CDST, CSRC, EDGE, NODE, WEIGHT, Value, rewrite, toposort
from .printer import format_ir
from .verify import IRError, verify

__all__ = ["Value", "NODE", "EDGE", "CSRC", "CDST", "WEIGHT", "toposort", "rewrite",
           "format_ir", "verify", "IRError"]
