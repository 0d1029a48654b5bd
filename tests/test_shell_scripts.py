"""The project's shell scripts check output without a race.

Under ``set -o pipefail``, ``cmd | grep -q pattern`` can fail a check that passed: grep
quits at its first match, and a writer still writing gets SIGPIPE, which pipefail makes
the pipeline's status: the check fails now and then, more often on a loaded machine. A
check searches captured text with a here-string instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pipe_into_grep_q_under_pipefail(script: Path) -> None:
    text = script.read_text()
    if "pipefail" not in text:
        return  # without pipefail the pipeline's status is grep's
    lines = text.replace("\\\n", " ").splitlines()  # continued lines joined
    racy = [line.strip() for line in lines if re.search(r"\|\s*grep\s+(-\w*q|--quiet)", line)]
    assert not racy, f"{script.name}: pipes into grep -q under pipefail: {racy}"
