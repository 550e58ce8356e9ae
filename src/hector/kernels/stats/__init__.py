"""Count facts: what index building reads back about integer count arrays (a CSR's row
lengths for its row bins, a graph's degrees for its statistics), one kernel per array."""
from .op import bin_facts, degree_facts

__all__ = ["bin_facts", "degree_facts"]
