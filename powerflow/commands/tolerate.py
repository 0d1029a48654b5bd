"""The ``--tolerate`` option, shared by ``powerflow operator`` and ``powerflow extender``.

Both must pool the same nodes (the plan's GPU counts assume the extender's
pool), so both take the same option with the same text.
"""

from __future__ import annotations

import argparse


def add_tolerate_option(parser: argparse.ArgumentParser, peer: str) -> None:
    """Add ``--tolerate``; ``peer`` names the other component that needs the same values."""
    parser.add_argument(
        "--tolerate",
        action="append",
        metavar="KEY[=VALUE]:EFFECT",
        help="a node taint PowerFlow's pools accept (repeatable; also KEY:EFFECT, KEY=VALUE "
        "or KEY for any value or effect; default nvidia.com/gpu; giving any replaces it). "
        f"Give the {peer} the same, and put matching tolerations into the DLJobs' pod "
        "templates: each pod goes only where its own tolerations allow",
    )
