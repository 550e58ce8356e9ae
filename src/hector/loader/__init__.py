"""Mini-batches by neighbour sampling: ``NeighborLoader`` yields ``Batch`` es of bipartite
``Graph`` blocks (see :mod:`hector.graph.block`)."""
from . import sampler
from .neighbor import Batch, NeighborLoader
from .sampler import SamplingIndex, relabel, sample_hop

__all__ = ["NeighborLoader", "Batch", "SamplingIndex", "sample_hop", "relabel"]
