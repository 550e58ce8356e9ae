"""``hector bench``'s captured peers: hector captured in CUDA graphs and PyG under
torch.compile(mode="reduce-overhead") are CUDA-only; on the CPU they are off by default and
asking for the capture is refused with the option named."""
import argparse

import pytest
import torch

from hector.bench import BenchConfig, configure, resolve
from hector.bench.__init__ import config_from_args


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU defaults")
def test_capture_is_off_on_the_cpu_and_refused_when_asked():
    assert resolve(BenchConfig(device="cpu", no_pyg=True)).capture is False
    with pytest.raises(ValueError, match="--capture"):
        resolve(BenchConfig(device="cpu", no_pyg=True, capture=True))


def test_no_capture_flag_reaches_the_config():
    p = argparse.ArgumentParser()
    configure(p)
    assert config_from_args(p.parse_args(["--no-capture"])).capture is False
    assert config_from_args(p.parse_args([])).capture is None
