"""The emulated API server, kept importable as ``support.kube_emulator`` for the tests.

It moved to ``powerflow.twin.emulator`` so that the twin (and ``powerflow demo``)
can run it outside pytest. This module *is* that module (one object, so that
``monkeypatch.setattr(kube_emulator, "_HISTORY", 3)`` still reaches it).
"""

import sys

from powerflow.twin import emulator

sys.modules[__name__] = emulator
