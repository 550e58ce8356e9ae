"""Graph structures: the immutable ``Graph`` every layer reads, and its index records."""
from .cache import graph_of
from .graph import SUPER_NODE_DEGREE, Graph
from .structures import CSR, CompactMap, DegreeStats
from .transforms import with_self_loops

__all__ = ["Graph", "graph_of", "CSR", "CompactMap", "DegreeStats", "SUPER_NODE_DEGREE", "with_self_loops"]
