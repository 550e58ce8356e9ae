"""TF32 follows torch's switch, whichever of torch's APIs set it: hector's fp32 GEMMs take
TF32 products where torch allows them, and reading the switch never raises (torch raises on
a legacy read after the new API set it)."""
import sys
from pathlib import Path

import pytest
import torch

from hector.compiler import warm
from hector.device import tf32_allowed, tf32_matmuls
from hector.kernels.segment_mm.spec import fp32_dot

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/helpers.py
from helpers import TF32_APIS, set_tf32, tf32_state  # noqa: E402


@pytest.mark.parametrize("api", TF32_APIS)
@pytest.mark.parametrize("on", [True, False])
def test_the_switch_is_read_through_any_api(api, on, monkeypatch):
    monkeypatch.delenv("HECTOR_FP32_DOT", raising=False)
    with tf32_state():
        set_tf32(api, on)
        assert tf32_allowed() is on
        assert fp32_dot() == ("tf32" if on else "ieee")
        # the warm replays key their captures on it: a capture keeps its precision
        assert warm._precision()[0] is on


def test_the_global_fp32_precision_reaches_the_gemms(monkeypatch):
    """``torch.backends.fp32_precision`` is inherited by a matmul backend left unset."""
    monkeypatch.delenv("HECTOR_FP32_DOT", raising=False)
    before = torch.backends.fp32_precision
    try:
        with tf32_state():
            torch.backends.cuda.matmul.fp32_precision = "none"
            torch.backends.fp32_precision = "tf32"
            assert tf32_allowed() and fp32_dot() == "tf32"
    finally:
        torch.backends.fp32_precision = before


@pytest.mark.parametrize("api", TF32_APIS)
def test_the_block_switch_restores_the_caller_s_setting(api):
    with tf32_state():
        set_tf32(api, True)
        with tf32_matmuls(False):
            assert not tf32_allowed() and fp32_dot() == "ieee"
        assert tf32_allowed()
        set_tf32(api, False)
        with tf32_matmuls(True):
            assert tf32_allowed()
        assert not tf32_allowed()
        if api == "matmul_precision":     # (no mix of torch's two APIs left behind)
            assert torch.get_float32_matmul_precision() == "highest"
