"""Test-wide settings.

Without a GPU, Triton kernels run under Triton's interpreter: the flag must be set before
triton is first imported, hence here, at collection start.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
