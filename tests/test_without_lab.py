"""The components without the ``lab`` extra, as the image installs them.

The image leaves out scipy, matplotlib, rich and kmock (docs/image.md), and
the Kubernetes client's unused asyncio copy (``kubernetes.aio``). Each
test runs a fresh interpreter in which those packages cannot be imported (a
None in ``sys.modules`` makes them unimportable, as a missing distribution would), so an import
that creeps into a component's graph fails here before it fails in a pod.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from powerflow.cli import LAB_PACKAGES

# What the Dockerfile deletes from the installed dependencies besides the lab.
IMAGE_REMOVES = frozenset({"kubernetes.aio"})

# A None in sys.modules is how Python marks a module as not importable: ``import``
# raises ModuleNotFoundError naming it and ``importlib.util.find_spec`` answers None.
BLOCK = textwrap.dedent(
    f"""
    import sys

    for name in {sorted(LAB_PACKAGES | IMAGE_REMOVES)!r}:
        sys.modules[name] = None
    """
)


def run_without_lab(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_block_refuses_what_the_lab_adds() -> None:
    done = run_without_lab("import rich")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr and "rich" in done.stderr


def test_every_component_module_imports_without_the_lab() -> None:
    done = run_without_lab(
        """
        import importlib, pkgutil
        for pkg in ("powerflow.operator", "powerflow.extender", "powerflow.nodeagent",
                    "powerflow.worker", "powerflow.kubeapi", "powerflow.core.policy",
                    "powerflow.core.models", "powerflow.core.devices",
                    "powerflow.commands.operator", "powerflow.commands.extender",
                    "powerflow.commands.nodeagent"):
            module = importlib.import_module(pkg)
            for info in pkgutil.walk_packages(getattr(module, "__path__", []), pkg + "."):
                importlib.import_module(info.name)
        leaked = sorted(m for m, module in sys.modules.items() if module is not None
                        and (m.partition(".")[0] in ("scipy", "matplotlib", "rich", "kmock")
                             or m.startswith("kubernetes.aio")))
        assert not leaked, leaked
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_help_lists_lab_commands_as_not_installed() -> None:
    done = run_without_lab(
        """
        from powerflow.cli import main
        try:
            main(["--help"])
        except SystemExit as exc:
            sys.exit(exc.code)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "operator" in done.stdout and "nodeagent" in done.stdout
    lines = done.stdout.splitlines()
    simulate = next(line for line in lines if line.strip().startswith("simulate"))
    assert "not installed" in simulate


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--hours", "1"],
        ["demo"],
        ["plan", "--demo"],
        ["nodeagent", "--simulate", "2", "--node-name", "n1", "--once"],
    ],
)
def test_a_lab_command_says_what_to_install_in_one_line(argv: list[str]) -> None:
    done = run_without_lab(
        f"""
        from powerflow.cli import main
        sys.exit(main({argv!r}))
        """
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"powerflow {argv[0]}: error:" in lines[0]
    assert "pip install 'powerflow[lab]'" in lines[0]
