"""Torch spellings of the activations' derivatives that several kernel families' references
use (the edgewise statements' ``gelu_grad``, the segment GEMM prologue's backward) and the
compiler's torch backend: one definition, in the constants the Triton helpers use, so every
backend rounds alike."""
import torch

INV_SQRT2 = 0.7071067811865476           # 1 / sqrt(2)
INV_SQRT_2PI = 0.3989422804014327        # 1 / sqrt(2 pi)


def gelu_grad(x: torch.Tensor) -> torch.Tensor:
    """d gelu(x) / dx = Phi(x) + x phi(x) (exact, erf-based gelu)."""
    return 0.5 * (1.0 + torch.erf(x * INV_SQRT2)) + x * torch.exp(-0.5 * x * x) * INV_SQRT_2PI
