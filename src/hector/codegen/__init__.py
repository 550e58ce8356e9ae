"""Triton kernels (``@triton.jit``), specialised by ``tl.constexpr`` flags.

Importing this package imports triton; the runtime imports it lazily, only on the Triton path,
so that ``TRITON_INTERPRET`` can still be set before the kernels are defined."""
