"""Intra-operator IR: frozen kernel specs and schedules (DESIGN.md section 2, ``plan/``)."""
from .attention import AttentionSpec, Schedule, default_schedule
from .gemm import GemmSchedule, GemmSpec

__all__ = ["AttentionSpec", "Schedule", "default_schedule", "GemmSpec", "GemmSchedule"]
