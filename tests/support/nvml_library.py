"""Whether this machine has NVIDIA's driver library (a GPU machine)."""

from __future__ import annotations

import ctypes


def has_nvml_library() -> bool:
    """True where ``libnvidia-ml.so.1`` loads: tests of the no-GPU path then do not run
    it (it would open the real GPUs), and tests of the real library do."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
