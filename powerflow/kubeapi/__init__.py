"""Kubernetes plumbing shared by the components that use the ``kubernetes`` client.

The operator and the node agent must not import each other, yet both read
their cluster configuration by the same rules (``config``) and keep a
selection of objects current by LIST then WATCH in a thread of their own
(``watch``). One copy of each lives here. This package may import
``kubernetes``; the core must not import it (``.importlinter``), and it
imports no component.
"""
