"""Compiled numeric kernels: the one place that knows about numba.

Why numba at all: the simulator's hot loops (a Levenberg-Marquardt fit of a
15-parameter model to a hundred samples, the allocation's greedy over a few
hundred jobs) are numpy calls on tiny arrays, where each call's fixed cost
(about a microsecond) dwarfs its arithmetic. Compiled, the same loops run
an order of magnitude faster with the same IEEE arithmetic (no fastmath).

``cache=True`` keeps the machine code next to the sources (or in the user's
cache folder when that is read-only), so only the first process on a machine
pays the compilation. ``NUMBA_DISABLE_JIT=1`` runs every kernel as plain
Python, e.g. for a debugger. A cold cache costs about 13 s of CPU once
(``powerflow simulate --scheduler powerflow --hours 0.5 --nodes 8`` compiles
every kernel).

One rule follows from the cache: a kernel calls compiled helpers only from
its own file. Numba checks the timestamp of the file that holds a cached
function, not of the files its callees live in, so a helper edited in another
file would leave stale machine code behind. The kernels therefore live in one
file per package (``models/kernels.py``, ``policy/greedy_kernels.py``,
``lab/sim/kernels.py``; ``core/learning.py`` has two self-contained ones).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., object])

log = logging.getLogger(__name__)


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
