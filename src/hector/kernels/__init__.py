"""The kernel families, one folder each (``attention/``, ``segment_mm/``): a public op, a frozen
spec, the Triton launches and a plain-PyTorch reference.  Their Triton kernels are rendered from
Jinja2 templates through one registry (:mod:`hector.kernels.registry`; shared macros in
``templates/``), cached on disk by a hash of the spec, and autotuned over a small config list
(:mod:`hector.kernels.autotune`).

Kernels import only ``hector.graph``, ``hector.device`` and ``hector.checks``, never the compiler.
The registry, the eager call path, the size arithmetic and the ``stats`` family (count facts
that a ``Graph``'s build reads back) sit below ``hector.graph``: they import none of it.

Importing this package imports neither triton nor jinja2: kernels are rendered and imported
on first use, so that ``TRITON_INTERPRET`` can still be set before they are defined."""
