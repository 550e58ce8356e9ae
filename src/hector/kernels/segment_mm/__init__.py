"""Segment GEMM with gather/scatter (the typed linear layers): the public op (``op``), its
frozen spec and schedule (``spec``), the Triton launches (``launch``), the custom ops and autograd
function that run them (``custom_ops``), the plain PyTorch backend (``reference``) and the Jinja2
templates (``templates/``)."""
