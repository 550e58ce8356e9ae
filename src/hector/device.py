"""Facts about where kernels run, in one place: is Triton's interpreter on, which dtypes the
Triton kernels take, which backend ``'auto'`` picks, how many SMs the GPU has, and whether
torch lets fp32 matmuls use TF32."""
from __future__ import annotations

import contextlib
import functools
import os

import torch

#: The ``backend=`` choices of every op and of :func:`hector.compile`.
BACKENDS = ("auto", "torch", "triton")
#: Dtypes the Triton kernels are generated for (others run on the torch backend).
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: SM count assumed off-GPU (interpreter runs, planning on the CPU): an H200.
DEFAULT_NUM_SMS = 132


def interpreting() -> bool:
    """Whether Triton runs under its CPU interpreter (``TRITON_INTERPRET`` set and not 0).
    Read on every call: tests set the variable before triton is first imported."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available(device: torch.device) -> bool:
    """Whether Triton kernels can run on ``device``: a CUDA device or the interpreter."""
    return device.type == "cuda" or interpreting()


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """``'auto'`` -> ``'triton'`` where Triton can run and supports ``dtype``, else
    ``'torch'``; an explicit choice is returned unchanged (callers validate it first)."""
    if backend == "auto":
        return "triton" if triton_available(device) and dtype in TRITON_DTYPES else "torch"
    return backend


def choose_backend(backend: str, tensor: torch.Tensor, name: str) -> str:
    """Validate an op's ``backend=`` argument and resolve ``'auto'`` for input ``tensor``
    (called ``name`` in the messages): ``'torch'`` or ``'triton'``.  An explicit ``'triton'``
    that cannot run raises here, before any kernel is rendered."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    backend = resolve_backend(backend, tensor.device, tensor.dtype)
    if backend == "triton":
        if not triton_available(tensor.device):
            raise ValueError(f"backend='triton' needs CUDA tensors ({name} is on "
                             f"{tensor.device}) or TRITON_INTERPRET=1; use backend='torch' "
                             "on the CPU")
        if tensor.dtype not in TRITON_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; backend='triton' supports "
                            f"{', '.join(map(str, TRITON_DTYPES))} (use backend='torch')")
    return backend


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (``DEFAULT_NUM_SMS`` elsewhere)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


#: torch's per-backend precision switch (torch >= 2.9), which every TF32 setting of torch's
#: shows through: the legacy ``allow_tf32`` and ``set_float32_matmul_precision``, and the new
#: ``torch.backends[.cuda.matmul].fp32_precision``.  Reading ``allow_tf32`` after a user set
#: the new one raises ("mix of the legacy and new APIs"), so it is read only where torch has
#: no new switch.
_NEW_PRECISION_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_allowed() -> bool:
    """Whether torch lets fp32 matmuls run on TF32 tensor cores (hector's fp32 GEMMs follow
    it, as torch's own matmuls do); off by default, as in PyTorch."""
    matmul = torch.backends.cuda.matmul
    if _NEW_PRECISION_API:
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """TF32 fp32 matmuls on or off inside the block (torch's and hector's), restored after,
    through the switch that neither raises nor leaves a mix of torch's two APIs behind."""
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if _NEW_PRECISION_API else "allow_tf32"
    before = getattr(matmul, name)
    setattr(matmul, name, ("tf32" if enabled else "ieee") if _NEW_PRECISION_API
            else bool(enabled))
    try:
        yield
    finally:
        setattr(matmul, name, before)
