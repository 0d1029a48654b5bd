#!/usr/bin/env python3
"""Read-only NVML probe: GPUs, clocks, power limits, two energy readings.

Never sets clocks or limits. Exit status 2 (one line on stderr) when the
machine has no NVIDIA GPU. See powerflow.nodeagent.probe.
"""

import sys

from powerflow.nodeagent.probe import main

if __name__ == "__main__":
    sys.exit(main())
