"""IR -> IR passes, run in order by :func:`hector.compiler.pipeline.run_pipeline`."""
from .common import Decision, GraphStats
from ..pipeline import PassRecord, run_pipeline

__all__ = ["Decision", "GraphStats", "PassRecord", "run_pipeline"]
