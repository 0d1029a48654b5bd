"""``scripts/in-image.sh``'s ``capture``, which the image's smoke tests read output through:
the command's own output and exit status, the command run again only when ``buildah
run`` lost its output (status 0 and no exit line), never when the command failed.

``buildah`` is a stand-in on ``PATH`` that runs the command on this machine and loses
the output of its first ``LOSE`` runs (status 0, nothing printed), as ``buildah run``
can on a loaded machine; with ``FAIL`` set it fails as buildah itself would.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HELPER = Path(__file__).resolve().parents[1] / "scripts" / "in-image.sh"

FAKE_BUILDAH = """#!/bin/sh
n=$(($(cat "$FAKE_DIR/runs" 2>/dev/null || echo 0) + 1))
echo "$n" > "$FAKE_DIR/runs"
while [ "$1" != "--" ]; do shift; done
shift
if [ -n "$FAIL" ]; then echo "Error: $FAIL" >&2; exit 125; fi
if [ "$n" -le "$LOSE" ]; then cat > /dev/null; exit 0; fi
exec "$@"
"""


def capture(
    tmp_path: Path, cmd: str, *, lose: int = 0, stdin: str | None = None, fail: str = ""
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``capture cmd`` as smoke-image.sh calls it (``set -euo pipefail``), and how many
    times ``buildah run`` was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "buildah"
    fake.write_text(FAKE_BUILDAH)
    fake.chmod(0o755)
    (tmp_path / "runs").write_text("0\n")
    script = 'set -euo pipefail; source "$0"; ctr=c; out=$(capture "$@"); printf "%s" "$out"'
    args = ["bash", "-c", script, str(HELPER), cmd]
    if stdin is not None:
        (tmp_path / "input").write_text(stdin)
        args.append(str(tmp_path / "input"))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "LOSE": str(lose),
        "FAIL": fail,
    }
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)
    return done, int((tmp_path / "runs").read_text())


def test_the_output_comes_with_the_exit_status_from_one_run(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "echo hello; echo to-stderr >&2; exit 3")
    assert done.returncode == 0
    assert done.stdout == "hello\nexit 3"
    assert "to-stderr" in done.stderr
    assert runs == 1


def test_a_failing_command_is_not_run_again(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "echo refused; exit 2")
    assert (done.returncode, done.stdout, runs) == (0, "refused\nexit 2", 1)


def test_a_lost_output_is_run_again_until_its_exit_line_comes(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "echo hello", lose=2)
    assert (done.returncode, done.stdout, runs) == (0, "hello\nexit 0", 3)
    assert done.stderr.count("came back without its exit line") == 2


def test_three_lost_outputs_fail_the_smoke_test(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "echo hello", lose=3)
    assert done.returncode != 0
    assert runs == 3
    assert "smoke test failed: buildah run lost the output of 'echo hello' three times" in (
        done.stderr
    )
    assert done.stdout == ""


def test_the_input_file_reaches_the_run_after_a_lost_one(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "cat", lose=1, stdin="print('planned')\n")
    assert (done.stdout, runs) == ("print('planned')\nexit 0", 2)


def test_output_without_a_trailing_newline_keeps_its_exit_line(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "printf hello; exit 4")
    assert (done.stdout, runs) == ("hello\nexit 4", 1)
    done, runs = capture(tmp_path, "printf 'a\\n\\n'; exit 0")
    assert (done.stdout, runs) == ("a\n\nexit 0", 1)  # an empty last line is kept
    done, runs = capture(tmp_path, "true")
    assert (done.stdout, runs) == ("exit 0", 1)


def test_a_failing_buildah_fails_at_once_with_its_status(tmp_path: Path) -> None:
    done, runs = capture(tmp_path, "echo hello", fail="no such container")
    assert done.returncode != 0
    assert runs == 1
    assert "smoke test failed: buildah run exited 125 for 'echo hello'" in done.stderr


def test_a_multi_line_command_is_named_by_its_first_line(tmp_path: Path) -> None:
    done, _ = capture(tmp_path, "echo one\necho two", lose=3)
    assert "lost the output of 'echo one' three times" in done.stderr
    assert "echo two" not in done.stderr
