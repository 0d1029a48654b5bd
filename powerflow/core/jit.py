"""Compiled numeric kernels: the one place that knows about numba.

Why numba at all: the simulator's hot loops (a Levenberg-Marquardt fit of a
15-parameter model to a hundred samples, the allocation's greedy over a few
hundred jobs) are numpy calls on tiny arrays, where each call's fixed cost
(about a microsecond) dwarfs its arithmetic. Compiled, the same loops run
an order of magnitude faster with the same IEEE arithmetic (no fastmath).

``cache=True`` keeps the machine code next to the sources (or in the user's
cache folder when that is read-only), so only the first process on a machine
pays the compilation. ``NUMBA_DISABLE_JIT=1`` runs every kernel as plain
Python, e.g. for a debugger. A cold cache costs about 25 s of CPU once
(``powerflow simulate --quick --workers 1``, which compiles every kernel, with
``NUMBA_CACHE_DIR`` an empty folder: 33.6 s, then 8.4 s with the same folder; the
placement kernel, ``policy/placement_kernels.py``, is about 18 s of it).

One rule follows from the cache: a kernel calls compiled helpers only from
its own file. Numba checks the timestamp of the file that holds a cached
function, not of the files its callees live in, so a helper edited in another
file would leave stale machine code behind. The kernels therefore live in one
file per part, none calling into another (``models/kernels.py``,
``policy/greedy_kernels.py``, ``policy/placement_kernels.py``,
``lab/sim/kernels.py``; ``core/learning.py`` has two self-contained ones).

No kernel uses numba's linear algebra (``np.dot``, ``@``, ``np.linalg``), which
needs scipy's BLAS (the components' image has no scipy), so numba's import-time
probe for it is refused ``scipy.linalg`` and fails at once
(``_array_math_without_blas``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., object])

log = logging.getLogger(__name__)


class _NoScipyLinalg(importlib.abc.MetaPathFinder):
    """Refuses ``scipy.linalg`` to the thread that made it (only while
    ``_array_math_without_blas`` imports): another thread importing scipy meanwhile
    is not refused."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "scipy.linalg" and threading.get_ident() == self._thread:
            raise ImportError("scipy.linalg is not for numba's BLAS probe (powerflow.core.jit)")
        return None


def _array_math_without_blas() -> None:
    """Import ``numba.np.arraymath`` with scipy's linear algebra hidden from its probe.

    Why: at import, numba probes for BLAS by importing ``scipy.linalg``, about
    0.2 s of CPU in every process where scipy is installed (the lab's; in the
    image, which has none, the probe fails at once either way;
    ``python -c "import numba.np.arraymath"``,
    0.69-0.75 s, against 0.47-0.52 s for ``python -c "import powerflow.core.jit"``,
    which imports it without the probe; 2-core machine, 5 runs each), for linear
    algebra no kernel uses. What the probe's answer decides: only
    whether ``np.correlate`` and ``np.convolve`` in a kernel take BLAS or
    numba's own loop (no kernel uses them); a kernel with linear algebra still
    compiles, importing scipy's BLAS then (``tests/test_jit.py``), and fails
    where scipy is missing, as in the image, either way. Only that one import
    is refused, while numba imports the module (a process that imported
    ``scipy.linalg`` before keeps the probe's answer), and a failed import
    leaves nothing behind, so ``import scipy.linalg`` works afterwards.
    """
    if "numba.np.arraymath" in sys.modules:
        return
    finder = _NoScipyLinalg()
    sys.meta_path.insert(0, finder)
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


_array_math_without_blas()


def njit(fn: F) -> F:
    """``numba.njit`` with the project's settings, typed as the function it wraps.

    Where numba finds no writable cache location (a container with a
    read-only root file system and no writable home, as hardened pod specs
    have), ``cache=True`` fails at import; the kernels then compile in each
    process instead of taking the scheduler down.
    """
    try:
        compiled = numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError as exc:
        if "cannot cache" not in str(exc):
            raise
        log.info("no writable numba cache for %s: compiling it in this process", fn.__name__)
        compiled = numba.njit(nogil=True)(fn)
    return cast(F, compiled)
