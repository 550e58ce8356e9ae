"""hector: fast, memory-lean GNN layers on GPUs (the Hector compiler and DF-GNN fusion)."""
from .compiler.execute import retain_saved
from .compiler.explain import explain
from .compiler.program import Program, compile
from .graph import Graph
from .compiler.warm import warm_graphs

from ._version import __version__
__all__ = ["Graph", "compile", "Program", "explain", "retain_saved", "warm_graphs",
           "__version__"]
