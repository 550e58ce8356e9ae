"""Segment GEMM with gather/scatter (the typed linear layers): the public op (``op``), its
frozen spec and schedule (``spec``), the autograd function and Triton launches (``launch``), the
plain PyTorch backend (``reference``) and the Jinja2 templates (``templates/``)."""
