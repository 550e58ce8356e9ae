"""Filtered ranking for link prediction: each query's rank of its truth among every entity,
its other known answers left out, without materialising the ``[B, N]`` score table
(:func:`filtered_ranks`; the torch reference and the score kinds' one definition in
:mod:`.reference`)."""
from .op import BACKENDS, filtered_ranks
from .reference import KINDS, scores_torch

__all__ = ["BACKENDS", "KINDS", "filtered_ranks", "scores_torch"]
