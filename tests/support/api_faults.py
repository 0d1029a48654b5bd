"""The emulator's injected API faults, importable as ``support.api_faults`` for the
tests: the module lives with the emulator in ``powerflow.lab.twin.api_faults`` (one object)."""

import sys

from powerflow.lab.twin import api_faults

sys.modules[__name__] = api_faults
