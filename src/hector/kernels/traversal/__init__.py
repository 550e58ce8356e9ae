"""Traversal kernels (Hector's traversal template): a node-parallel walk over a CSR whose
entries carry a column (the row read) and a weight, with the fused epilogue of the statement
list (addends of the output's own rows, a bias vector).  ``op`` is the public entry, ``spec``
the static choices, ``csr`` builds and composes the weighted CSRs of data movements,
``launch`` runs the Triton kernel, ``reference`` the same op in plain PyTorch."""
