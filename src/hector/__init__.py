"""hector: fast, memory-lean GNN layers on GPUs (the Hector compiler and DF-GNN fusion)."""
from .compile import Program, compile
from .explain import explain
from .graph import Graph

__version__ = "0.1.0"
__all__ = ["Graph", "compile", "Program", "explain", "__version__"]
