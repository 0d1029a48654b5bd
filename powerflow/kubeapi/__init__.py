"""Kubernetes plumbing shared by the components.

The operator and the node agent must not import each other, yet both read
their cluster configuration by the same rules (``config``), talk to the API
server through a client whose calls all time out (``client``) and keep a
selection of objects current by LIST then WATCH in a thread of their own
(``watch``); they, and the extender (which has its own HTTP client), wait
between tries against a failing API server by the same rules (``backoff``,
which imports no ``kubernetes``). One copy of each lives here. This package may
import ``kubernetes``; the core must not import it (``.importlinter``), and it
imports no component.
"""
