"""The README and docs name only files that exist (links, paths in commands and in code
spans) and only modules that exist."""

from __future__ import annotations

import ast
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


TOP = (
    "powerflow",
    "tests",
    "docs",
    "scripts",
    "benchmarks",
    "operator",
    "extender",
    "nodeagent",
    "worker",
    "helm",
    "e2e",
    "crds",
    "examples",
)
SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(rf"^((?:{'|'.join(TOP)})/[\w./*-]*)(?:::(\w+))?$")
MODULE = re.compile(r"^powerflow(?:\.\w+)+(?![\w/])")  # not an annotation key
# pyproject.toml's package-dir: these packages live at the top of the repository.
MAPPED = {"operator", "extender", "nodeagent", "worker"}


def _top_level_names(source: str) -> set[str]:
    """What a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _is_module(parts: list[str]) -> bool:
    """Some prefix of ``powerflow.a.b...`` (at least ``powerflow.a``) is a module, and the
    next name, if any, is one that module defines (a submodule would have matched as a
    longer prefix)."""
    for k in range(len(parts), 1, -1):
        head = parts[1:k]
        base = ROOT.joinpath(*head) if head[0] in MAPPED else ROOT.joinpath("powerflow", *head)
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.exists():
                rest = parts[k:]
                return not rest or rest[0] in _top_level_names(source.read_text())
    return False


def _absent(span: str) -> bool:
    """The code span names a path or module of this repository that it does not have."""
    if match := REPO_PATH.match(span):
        path, function = match.group(1).rstrip("/"), match.group(2)
        found = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
        if not found or not all(f.exists() for f in found):
            return True
        return bool(function) and not any(
            re.search(rf"def {function}\b", f.read_text()) for f in found if f.is_file()
        )
    match = MODULE.match(span)
    return match is not None and not _is_module(match.group(0).split("."))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_and_module_in_code_spans_exists(page: Path) -> None:
    """A `path/in/the/repo` (globs allowed, `file.py::test` names a function in it) and
    a `powerflow.module[.attribute]` in a code span name something the repository has.
    Paths in other repositories (`zeus/...`) and annotation keys (`powerflow.io/...`)
    do not start that way and are not checked."""
    missing = [span for span in map(str.strip, SPAN.findall(page.read_text())) if _absent(span)]
    assert missing == []
