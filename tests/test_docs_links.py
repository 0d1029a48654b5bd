"""The README and docs name only files that exist (links and paths in commands)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)")
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:ya?ml|sh|md|py|json|png|csv))\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [
        target
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:"))
        and not (page.parent / target).exists()
    ]
    assert missing == []


def test_every_file_the_readme_commands_name_exists() -> None:
    """Paths in the README's shell blocks (the install path above all) exist,
    except what the commands themselves write (--out, --report, results)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks
    named = {p for block in blocks for p in PATH.findall(block)}
    written = {p for block in blocks for p in re.findall(r"--(?:out|report) (\S+)", block)}
    missing = sorted(p for p in named - written if not (ROOT / p).exists())
    assert named and missing == []
