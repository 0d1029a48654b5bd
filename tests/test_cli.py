"""The command line itself: help, version, and the error convention."""

from __future__ import annotations

import subprocess
import sys

import pytest

from powerflow import __version__
from powerflow.cli import main


def test_version_via_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "powerflow", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"powerflow {__version__}"


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: powerflow" in capsys.readouterr().out
