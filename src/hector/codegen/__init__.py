"""Triton kernels rendered from Jinja2 templates (``templates/``) through one registry
(:mod:`hector.codegen.registry`), cached on disk by a hash of the spec, and autotuned over a
small config list (:mod:`hector.codegen.autotune`).

Importing this package imports neither triton nor jinja2: kernels are rendered and imported
on first use, so that ``TRITON_INTERPRET`` can still be set before they are defined."""
