"""What a gather-scatter traversal kernel computes (the static choices rendered into it).

``out[r] = sum_{j in row r} val_j * x[col_j] + sum_i coef_i * addend_i[r] + bias``

* ``num_addends``: how many tensors of the output's own rows are added in the epilogue (a
  residual, the self-loop term), each with a runtime coefficient (+1 for ``add``, -1 for
  ``sub``);
* ``has_bias``: a bias vector of the output width added to every row.

Accumulation is fp32 whatever the storage dtype; the output is stored in ``x``'s dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

#: The most addends a kernel takes (a relational layer needs one: the root/self term).
MAX_ADDENDS = 3


@dataclass(frozen=True)
class TraversalKernelSpec:
    num_addends: int = 0
    has_bias: bool = False

    def __post_init__(self):
        if type(self.num_addends) is not int or not 0 <= self.num_addends <= MAX_ADDENDS:
            raise ValueError(f"num_addends must be an int in [0, {MAX_ADDENDS}], "
                             f"got {self.num_addends!r}")
        if type(self.has_bias) is not bool:
            raise TypeError(f"has_bias must be a bool, got {self.has_bias!r}")

    def params(self) -> dict:
        """Render parameters of the ``traversal_csr`` kernel (see kernels/registry.py)."""
        return dict(num_addends=self.num_addends, has_bias=self.has_bias)
