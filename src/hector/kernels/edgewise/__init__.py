"""Edge-wise statements fused into one generated kernel (see ``spec.py``)."""
