"""The install mapping: every package on disk is listed, and none shadows the stdlib."""

from __future__ import annotations

import importlib
import operator as stdlib_operator
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> tuple[list[str], dict[str, str]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return cfg["packages"], cfg["package-dir"]


def test_every_package_on_disk_is_declared() -> None:
    packages, package_dir = _declared()
    on_disk = set()
    for pkg, folder in package_dir.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join((pkg, *rel)))
    assert on_disk == set(packages)


def test_components_import_under_the_package_only() -> None:
    packages, _ = _declared()
    for name in packages:
        importlib.import_module(name)
    assert stdlib_operator.__file__ is not None
    assert "site-packages" not in stdlib_operator.__file__
    assert callable(stdlib_operator.itemgetter)
