"""The package's metadata: one version for the book and the package."""

import tomllib
from pathlib import Path

import rlbook

ROOT = Path(__file__).resolve().parents[1]


def test_package_version_is_the_book_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == rlbook.__version__


def test_requirements_pin_exact_versions():
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    pins = [line for line in lines if line]
    assert pins and all("==" in line for line in pins), "requirements.txt must pin exact versions"
    assert "torch==2.13.0" in pins
