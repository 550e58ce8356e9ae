"""Intra-operator IR: frozen kernel specs and schedules (DESIGN.md section 2, ``plan/``)."""
from .attention import AttentionSpec, Schedule, default_schedule

__all__ = ["AttentionSpec", "Schedule", "default_schedule"]
