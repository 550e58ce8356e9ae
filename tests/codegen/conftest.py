"""Fixtures of the codegen tests: a kernel cache folder of the test's own."""
import pytest

from hector.codegen import autotune, registry


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh ``HECTOR_CACHE_DIR`` under ``tmp_path`` and no in-process memo, before and
    after (the session cache of tests/conftest.py is used again afterwards)."""
    monkeypatch.setenv("HECTOR_CACHE_DIR", str(tmp_path / "kernels"))
    registry.clear_memo()
    autotune.clear_memo()
    yield tmp_path / "kernels"
    registry.clear_memo()
    autotune.clear_memo()
