"""Fixtures for the dataset tests: the real data folder shared next to the project."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import SHARED_DATA  # noqa: E402


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` relative to the repository root; skip when the machine lacks it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not available: {SHARED_DATA} does not exist "
                    "(they live outside the project and are never copied into it)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def data_dir(shared_data):
    """``data_dir("cora")``: one dataset's folder, skipping the test when only it is missing."""
    def get(name: str) -> Path:
        path = shared_data / name
        if not path.is_dir():
            pytest.skip(f"real dataset folder {path} not available")
        return path
    return get
