"""Build a link tree in which the import names match the installed package.

The components live in top-level folders (``operator/``, ``extender/``,
``nodeagent/``, ``worker/``) that ``pyproject.toml`` maps into the package as
``powerflow.operator`` and so on. Static tools (mypy, import-linter) read
folders, not install mappings, and would see ``operator/`` as the stdlib's
``operator``. This script lays out ``build/typecheck/powerflow`` with symlinks
so that those tools see exactly the package that ``pip install`` builds.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("operator", "extender", "nodeagent", "worker")


def build(dest: Path) -> Path:
    pkg = dest / "powerflow"
    if dest.exists():
        shutil.rmtree(dest)
    pkg.mkdir(parents=True)
    for entry in (ROOT / "powerflow").iterdir():
        if entry.name == "__pycache__" or entry.name in COMPONENTS:
            continue
        (pkg / entry.name).symlink_to(entry)
    for name in COMPONENTS:
        if (ROOT / name / "__init__.py").exists():
            (pkg / name).symlink_to(ROOT / name)
    return dest


if __name__ == "__main__":
    out = build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "typecheck")
    print(out)
