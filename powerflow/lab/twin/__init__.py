"""The twin: every PowerFlow component together on one machine, without a cluster or a GPU.

A library for tests (``tests/test_twin.py``) and ``powerflow demo``:
the emulated API server (``emulator``, served by ``apiserver``), the operator
and the extender started as a user starts them (``components``), a small
kube-scheduler (``scheduler``), node agents on simulated GPUs and a simulated
kubelet whose workers train at the ground truth's speed (``kubelet``), the
time scale that shrinks the trace while every part reads the real clock
(``timescale``), and the mini trace (``trace``). ``harness.Twin`` puts them
together; ``docs/twin.md`` says how.

Nothing of PowerFlow imports this package (``.importlinter``: the core and the
components stay unaware of it); it imports them, as a user's cluster runs them.
"""
