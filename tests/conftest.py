"""Test-wide settings.

Without a GPU, Triton kernels run under Triton's interpreter: the flag must be set before
triton is first imported, hence here, at collection start.

Rendered kernels and autotuning results go to a temporary cache folder of this session, so
tests never write to ``~/.cache/hector`` nor read what another run left there.
"""
import atexit
import os
import shutil
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_CACHE = tempfile.mkdtemp(prefix="hector-test-kernels-")
os.environ["HECTOR_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
