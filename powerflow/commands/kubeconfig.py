"""The ``--kubeconfig`` option, shared by ``powerflow operator`` and ``powerflow nodeagent``.

Both read their configuration by the same rules (``powerflow.kubeapi.config``),
so both take the same option with the same text. Kept apart from that module
so that building the command line does not import ``kubernetes``.
"""

from __future__ import annotations

import argparse


def add_kubeconfig_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--kubeconfig FILE`` (``None`` when not given: ``resolve_source`` decides)."""
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: in a pod its service account, else $KUBECONFIG, "
        "else ~/.kube/config)",
    )
