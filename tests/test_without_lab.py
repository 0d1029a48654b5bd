"""The components without the ``lab`` extra, as the image installs them.

The image leaves out scipy, matplotlib, adjustText, rich and kmock (docs/image.md), and
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

from powerflow.cli import LAB_CODE, LAB_PACKAGES, lab_part

# What the Dockerfile deletes besides the lab's packages: the Kubernetes client's
# asyncio copy and the lab's own code.
IMAGE_REMOVES = frozenset({"kubernetes.aio", LAB_CODE})

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
                        and (m.partition(".")[0] in ("scipy", "matplotlib", "adjustText",
                                                     "rich", "kmock")
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


def test_a_failed_import_is_the_labs_only_when_it_names_the_lab() -> None:
    assert lab_part("scipy.optimize") == "scipy"
    assert lab_part("powerflow.lab") == LAB_CODE
    assert lab_part("powerflow.lab.sim.engine") == LAB_CODE
    assert lab_part("powerflow.labels") is None
    assert lab_part("powerflow.core.policy") is None
    assert lab_part("yaml") is None


def test_only_the_labs_code_gone_still_says_what_to_install() -> None:
    """The image deletes ``powerflow/lab`` itself; a command that reaches for it first
    says what to install, it does not trace back."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.modules['powerflow.lab'] = None\n"
         "from powerflow.cli import main\nsys.exit(main(['plan', '--demo']))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "pip install 'powerflow[lab]'" in done.stderr and "Traceback" not in done.stderr


def test_simulated_gpus_need_the_labs_code_not_its_packages() -> None:
    """``nodeagent --simulate`` runs the ground truth, which needs numpy only: without
    the lab's packages it gets past the lab check (and stops at the missing cluster)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n"
         f"for name in {sorted(LAB_PACKAGES)!r}:\n    sys.modules[name] = None\n"
         "from powerflow.cli import main\n"
         "sys.exit(main(['nodeagent', '--simulate', '2', '--node-name', 'n1', '--once',"
         " '--kubeconfig', '/nonexistent']))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "powerflow[lab]" not in done.stderr, done.stderr[-2000:]
    assert "/nonexistent" in done.stderr, done.stderr[-2000:]
