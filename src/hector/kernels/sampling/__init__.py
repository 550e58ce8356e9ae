"""Neighbour sampling's kernel: Floyd's algorithm, a uniform sample without replacement of
``k`` of each group's ``d`` candidates, in static shapes (see :func:`floyd_table`)."""
from .op import floyd_table

__all__ = ["floyd_table"]
