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


@pytest.mark.parametrize("command", ["operator", "extender", "nodeagent"])
def test_a_cluster_component_loads_none_of_the_simulator(command: str) -> None:
    """The operator, extender and node agent restart in crash loops and at every
    upgrade: their command line loads only their own subcommand, not the simulator,
    matplotlib, scipy or numba that ``simulate``'s options pull in (about 2 s a start)."""
    probe = (
        "import sys\n"
        "from powerflow.cli import main\n"
        "try:\n"
        f"    main([{command!r}, '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('powerflow.lab.sim', 'matplotlib', 'scipy', 'numba')\n"
        "print(sorted({m.split('.')[0] + ('.sim' if m.startswith('powerflow.lab.sim') else '')\n"
        "    for m in sys.modules if m.startswith(heavy)}))\n"
    )
    assert _last_line(probe) == "[]"


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_simulation_command_starts_without_matplotlib(command: str) -> None:
    """Matplotlib is a third of a single simulation's start-up; only drawing a
    plot loads it, so parsing a simulation command's line never does."""
    probe = (
        "import sys\n"
        "from powerflow.cli import build_parser\n"
        f"build_parser({command!r})\n"
        "print('matplotlib' in sys.modules)\n"
    )
    assert _last_line(probe) == "False"


def test_a_json_run_loads_no_drawing_or_cluster_library() -> None:
    """``powerflow simulate --scheduler ... --json`` as a user runs it, start to end:
    it prints JSON, so it loads neither rich (its table, the comparison's progress
    bar) nor matplotlib, and nothing of Kubernetes or the twin; each would be start-up
    spent on nothing."""
    probe = (
        "import json, sys\n"
        "from contextlib import redirect_stdout\n"
        "from io import StringIO\n"
        "from powerflow.cli import main\n"
        "out = StringIO()\n"
        "with redirect_stdout(out):\n"
        "    code = main(['simulate', '--scheduler', 'gandiva', '--frequency', '1410',\n"
        "                 '--hours', '0.05', '--json'])\n"
        "assert code == 0 and json.loads(out.getvalue())['jobs'] >= 1\n"
        "heavy = ('rich', 'matplotlib', 'kubernetes', 'kopf', 'httpx', 'powerflow.lab.twin')\n"
        "print(sorted({m for m in sys.modules if m.startswith(heavy)}))\n"
    )
    assert _last_line(probe) == "[]"


@pytest.mark.parametrize(
    "argv",
    [["simulate", "--help"], ["--help"], ["bogus"], ["-h", "operator"], ["--help", "simulate"]],
)
def test_help_and_unknown_commands_still_list_every_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    if argv[0] == "simulate":
        assert "--scheduler" in text
    else:
        for name in ("simulate", "operator", "extender", "nodeagent", "demo"):
            assert name in text


def _last_line(probe: str) -> str:
    """The last line ``probe`` prints, run in a fresh interpreter (its imports its own)."""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]
