"""IR -> IR passes (canonicalize, reorder, compact, fuse, autodiff), each a module with a
``run`` function; :mod:`hector.compiler.pipeline` runs them in order.  ``common`` holds what
they share: the ``Decision`` record and the ``GraphStats`` cost-model input.  ``fuse`` stands
on ``fuse_group`` (operators grouped into kernels), ``fuse_gemm`` (the segment GEMM's
prologues and epilogues), ``fuse_attention`` (the attention pattern) and ``fuse_rewrite``
(the pass's name and shared rewrite helpers)."""
