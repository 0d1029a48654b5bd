"""The image's pinned dependencies (requirements/*.txt) agree with pyproject.toml.

The image installs exactly these pins (Dockerfile), so a dependency added to
pyproject.toml without re-running scripts/lock-requirements.sh would be missing
from the image, or installed at whatever version the index has that day.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# The image's interpreter (Debian bookworm's Python) on either architecture.
IMAGE_ENVIRONMENTS = [
    {
        "python_version": "3.11",
        "python_full_version": "3.11.2",
        "platform_machine": machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    for machine in ("x86_64", "aarch64")
]


def pins(path: Path) -> dict[str, list[Requirement]]:
    """Each pinned requirement of a uv-compiled file, by canonical name."""
    found: dict[str, list[Requirement]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            req = Requirement(line)
            found.setdefault(canonicalize_name(req.name), []).append(req)
    return found


def pinned_version(reqs: list[Requirement], env: dict[str, str]) -> str | None:
    """The one version pinned for ``env`` (None when no line applies there)."""
    applying = [r for r in reqs if r.marker is None or Marker(str(r.marker)).evaluate(env)]
    assert len(applying) <= 1, f"two pins apply at once: {applying}"
    if not applying:
        return None
    (spec,) = applying[0].specifier
    assert spec.operator == "==", f"not a pin: {applying[0]}"
    return spec.version


def project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def declared(extra: str | None) -> list[Requirement]:
    proj = project()
    lines = proj["dependencies"] if extra is None else proj["optional-dependencies"][extra]  # type: ignore[index]
    return [Requirement(line) for line in lines]  # type: ignore[union-attr]


def test_every_dependency_is_pinned_within_its_range_for_the_image() -> None:
    runtime, lab = pins(ROOT / "requirements/runtime.txt"), pins(ROOT / "requirements/lab.txt")
    for reqs, locked in ((declared(None), runtime), (declared("lab"), lab)):
        for req in reqs:
            name = canonicalize_name(req.name)
            assert name in locked, f"{req} is not in the lock: run scripts/lock-requirements.sh"
            for env in IMAGE_ENVIRONMENTS:
                version = pinned_version(locked[name], env)
                assert version is not None, f"{req}: no pin for {env['platform_machine']}"
                assert req.specifier.contains(version, prereleases=True), (
                    f"{req}: pinned {version}: run scripts/lock-requirements.sh"
                )


def test_the_lab_lock_keeps_the_runtime_versions() -> None:
    """The build stage installs the lab on top of the runtime to compile the kernels,
    then removes it: it must not replace a runtime package with another version."""
    runtime, lab = pins(ROOT / "requirements/runtime.txt"), pins(ROOT / "requirements/lab.txt")
    for name, reqs in runtime.items():
        for env in IMAGE_ENVIRONMENTS:
            assert pinned_version(lab[name], env) == pinned_version(reqs, env), name


def test_the_lab_is_what_the_cli_expects_to_be_missing_from_the_image() -> None:
    """powerflow.cli.LAB_PACKAGES names the lab's import names; the image test
    (tests/test_without_lab.py) blocks exactly those."""
    from powerflow.cli import LAB_PACKAGES

    direct = {canonicalize_name(r.name) for r in declared("lab")}
    assert direct == {canonicalize_name(name) for name in LAB_PACKAGES}
