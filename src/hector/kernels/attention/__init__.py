"""Fused graph attention (score, edge softmax, aggregation): the public op (``op``), its frozen
spec and schedule (``spec``), the strategy choice, plans and per-graph row tables (``plan``),
the Triton launches (``launch``), the custom operators and autograd glue (``custom_ops``), the
plain PyTorch backend (``reference``) and the Jinja2 templates (``templates/``)."""
