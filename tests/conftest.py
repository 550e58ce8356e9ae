"""Test-wide settings.

Without a GPU, Triton kernels run under Triton's interpreter: the flag must be set before
triton is first imported, hence here, at collection start.

Rendered kernels and autotuning results go to a temporary cache folder of this test run, so
tests never write to ``~/.cache/hector`` nor read what another run left there.

``HECTOR_TEST_PROGRAM_ORDER=reversed`` (or ``shuffled``) runs every interpreted launch's
programs in that order instead of grid order (``helpers.program_order``): a sweep for
kernels that assume which program runs last, as a GPU would expose.

The test functions listed in ``slow-tests.txt`` are marked ``slow``: ``pytest -m "not slow"``
is the fast subset (a few minutes on a 2-core CPU, against 15-17 for the whole suite).
"""
import atexit
import os
import shutil
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_CACHE = tempfile.mkdtemp(prefix="hector-test-kernels-")
os.environ["HECTOR_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

# Property tests draw the same examples on every run (a landing must not turn red because a
# new random draw found something); set HECTOR_HYPOTHESIS_RANDOM=1 to search afresh, as a
# bug hunt rather than a gate.
try:
    from hypothesis import settings as _hyp_settings
    _hyp_settings.register_profile("hector-ci", derandomize=True)
    _hyp_settings.register_profile("hector-random", derandomize=False)
    _hyp_settings.load_profile("hector-random" if os.environ.get("HECTOR_HYPOTHESIS_RANDOM")
                               else "hector-ci")
except ImportError:       # hypothesis is a test extra; its tests skip without it
    pass


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh ``HECTOR_CACHE_DIR`` under ``tmp_path`` and no in-process memo, before and
    after (the run's cache above is used again afterwards)."""
    from hector.kernels import autotune, registry     # after TRITON_INTERPRET is set above
    monkeypatch.setenv("HECTOR_CACHE_DIR", str(tmp_path / "kernels"))
    registry.clear_memo()
    autotune.clear_memo()
    yield tmp_path / "kernels"
    registry.clear_memo()
    autotune.clear_memo()


@pytest.fixture(autouse=True, scope="session")
def _program_order():
    """The test run's interpreted launches in ``$HECTOR_TEST_PROGRAM_ORDER`` (see above)."""
    order = os.environ.get("HECTOR_TEST_PROGRAM_ORDER", "grid")
    if order == "grid" or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        yield
        return
    from helpers import program_order
    with program_order(order):
        yield


# -- the `slow` marker ----------------------------------------------------------------------
#: Node ids (without parameters) of the test functions listed in slow-tests.txt: each is
#: marked `slow` at collection, every parametrization of it, so `pytest -m "not slow"` leaves
#: them out.  A test may also carry ``@pytest.mark.slow`` itself.
SLOW_TESTS_FILE = os.path.join(os.path.dirname(__file__), "slow-tests.txt")


def slow_tests() -> frozenset:
    with open(SLOW_TESTS_FILE, encoding="utf-8") as f:
        return frozenset(entry for entry in (line.split("#", 1)[0].strip() for line in f)
                         if entry)


def pytest_collection_modifyitems(config, items):
    slow = slow_tests()
    for item in items:
        if item.nodeid.split("[", 1)[0] in slow:
            item.add_marker(pytest.mark.slow)
