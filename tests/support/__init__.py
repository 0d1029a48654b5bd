"""Test support shared by the component tests: kmock's emulator made kube-apiserver-like.

Importable as ``support`` because pytest puts ``tests/`` on ``sys.path``
(rootdir-based ``prepend`` import mode, no ``tests/__init__.py``).
"""

from support.kube_emulator import KubeEmulator

__all__ = ["KubeEmulator"]
