"""The emulated API server, importable as ``support.kube_emulator`` for the tests.

It lives in ``powerflow.lab.twin.emulator`` so that the twin (and ``powerflow demo``)
can run it outside pytest. This module *is* that module (one object, so that
``monkeypatch.setattr(kube_emulator, "_HISTORY", 3)`` reaches it).
"""

import sys

from powerflow.lab.twin import emulator

sys.modules[__name__] = emulator
