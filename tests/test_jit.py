"""The compiled kernels survive a machine where numba cannot cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
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
        "import numpy as np\n"
        "import powerflow.core.jit\n"
        "import numba.np.arraymath as m\n"
        "from powerflow.lab.sim import kernels\n"
        "kernels.draw(np.arange(1), np.ones((11, 1)))\n"  # numba's CPU target set up
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


def test_no_kernel_uses_what_numba_s_blas_probe_decides() -> None:
    """The probe's answer picks BLAS or numba's own loop for ``np.correlate`` and
    ``np.convolve`` only; no compiled kernel may use them, so that refusing the probe
    changes no result (and no cached machine code depends on it)."""
    root = Path(__file__).resolve().parent.parent / "powerflow"
    jit = root / "core" / "jit.py"  # defines njit and says all this
    kernels = [p for p in root.rglob("*.py") if p != jit and "njit" in p.read_text()]
    assert len(kernels) >= 5
    for path in kernels:
        text = path.read_text()
        assert "correlate" not in text and "convolve" not in text, path


def test_only_the_importing_thread_is_refused_scipy_linalg() -> None:
    """While ``core.jit`` imports numba's array math, another thread importing scipy
    is not refused (``sys.meta_path`` is the whole process's)."""
    from powerflow.core.jit import _NoScipyLinalg

    finder = _NoScipyLinalg()
    with pytest.raises(ImportError, match="numba's BLAS probe"):
        finder.find_spec("scipy.linalg", None)
    assert finder.find_spec("scipy.optimize", None) is None
    seen: list[object] = []
    other = threading.Thread(target=lambda: seen.append(finder.find_spec("scipy.linalg", None)))
    other.start()
    other.join()
    assert seen == [None]
