"""The compiled kernels survive a machine where numba cannot cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Only .zip sources have a cache location under this locator list: for every
# other file numba's cache=True raises at decoration, as it does on a
# read-only root file system without a writable home.
NO_CACHE = {"NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "kernel_mod.py"
    module.write_text(body)
    env = {**os.environ, **NO_CACHE}
    return subprocess.run(
        [sys.executable, str(module)], capture_output=True, text=True, env=env, timeout=120
    )


def test_plain_numba_cache_fails_without_a_cache_location(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        "import numba\n@numba.njit(cache=True)\ndef twice(x):\n    return 2.0 * x\n",
    )
    assert done.returncode != 0
    assert "cannot cache" in done.stderr


def test_njit_compiles_per_process_without_a_cache_location(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        "from powerflow.core.jit import njit\n"
        "@njit\ndef twice(x: float) -> float:\n    return 2.0 * x\n"
        "print(twice(21.0))\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42.0"


def test_the_shipped_kernels_import_and_run_without_a_cache_location(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        "import numpy as np\n"
        "from powerflow.core.models import kernels\n"
        "a = np.array([[4.0, 2.0], [2.0, 3.0]])\n"
        "low, out = np.zeros((2, 2)), np.zeros(2)\n"
        "ok = kernels.cholesky_solve(a, np.array([8.0, 7.0]), low, out)\n"
        "import json; print(json.dumps([bool(ok), out.tolist()]))\n",
    )
    assert done.returncode == 0, done.stderr
    ok, solution = json.loads(done.stdout)
    assert ok is True
    assert solution == pytest.approx([1.25, 1.5], rel=1e-12)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_numba_finds_no_blas_yet_scipy_imports_afterwards() -> None:
    """numba's BLAS probe is refused scipy.linalg, as in the image (no scipy), and
    nothing of the refusal stays behind."""
    done = _python(
        "import sys\n"
        "import powerflow.core.jit\n"
        "import numba.np.arraymath as m\n"
        "print(m._HAVE_BLAS, 'scipy.linalg' in sys.modules)\n"
        "import scipy.linalg\n"
        "print(scipy.linalg.cho_solve.__name__)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "cho_solve"]
    # a process that imported scipy.linalg first keeps numba's BLAS
    first = _python(
        "import scipy.linalg\nimport powerflow.core.jit\n"
        "import numba.np.arraymath as m\nprint(m._HAVE_BLAS)\n"
    )
    assert first.stdout.split() == ["True"], first.stderr


def test_a_kernel_with_linear_algebra_still_compiles_taking_scipy_then() -> None:
    done = _python(
        "import sys\n"
        "import numpy as np\n"
        "from powerflow.core.jit import njit\n"
        "@njit\ndef norm2(a):\n    return np.dot(a, a)\n"
        "before = 'scipy.linalg' in sys.modules\n"
        "print(before, norm2(np.arange(4.0)), 'scipy.linalg' in sys.modules)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "14.0", "True"]
