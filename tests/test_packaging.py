"""What someone picking the library up expects: ``python -m hector``, a licence, a changelog and
the PEP 561 marker shipped with the package."""
import subprocess
import sys
from pathlib import Path

import hector

ROOT = Path(__file__).resolve().parents[1]


def test_python_m_hector_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "hector", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "usage: hector" in out.stdout and "bench" in out.stdout
    out = subprocess.run([sys.executable, "-m", "hector", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"hector {hector.__version__}"


def test_license_matches_pyproject():
    # (text checks, not tomllib: the package supports Python 3.10)
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "hector developers" in text


def test_typed_marker_is_package_data():
    assert (Path(hector.__file__).parent / "py.typed").is_file()
    assert '"hector" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_changelog_has_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "## [Unreleased]" in text
