"""No import circle in the package: no module reaches itself through the modules it
imports, deferred and type-only imports included (they are edges of the design all the
same). The layers contract in ``.importlinter`` keeps imports from going upward between
layers; this keeps each layer free of circles too.

The graph is grimp's (import-linter's), read from the link tree the static checks use
(``scripts/typecheck_tree.py``), so the components in their top-level folders are in it
under their package names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CIRCLES = """
import json, sys
import grimp

graph = grimp.build_graph("powerflow", cache_dir=None)
sys.setrecursionlimit(100_000)
index, low, stack, on, circles = {}, {}, [], set(), []

def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.find_modules_directly_imported_by(v):
        if w not in graph.modules:
            continue
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        part = []
        while True:
            w = stack.pop()
            on.discard(w)
            part.append(w)
            if w == v:
                break
        if len(part) > 1:
            circles.append(sorted(part))

for m in sorted(graph.modules):
    if m not in index:
        visit(m)
print(json.dumps({"modules": sorted(graph.modules), "circles": circles}))
"""


def _graph(tree: Path) -> dict[str, list[Any]]:
    out = subprocess.run(
        [sys.executable, "-c", CIRCLES], cwd=tree, capture_output=True, text=True, check=True
    )
    found: dict[str, list[Any]] = json.loads(out.stdout)
    return found


def _tree(dest: Path) -> Path:
    build = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck_tree.py"), str(dest)],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(build.stdout.strip())


def test_no_module_imports_itself_through_others(tmp_path: Path) -> None:
    graph = _graph(_tree(tmp_path / "tree"))
    components = {f"powerflow.{c}" for c in ("operator", "extender", "nodeagent", "worker")}
    assert components <= set(graph["modules"])  # the top-level folders are in the graph
    assert graph["circles"] == []


def test_the_check_sees_a_circle(tmp_path: Path) -> None:
    """Two modules that import each other, one only for its types, are found."""
    pkg = tmp_path / "powerflow"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from powerflow import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from powerflow import a\n"
    )
    (pkg / "c.py").write_text("from powerflow import a\n")
    assert _graph(tmp_path)["circles"] == [["powerflow.a", "powerflow.b"]]
