"""PowerFlow's policy and placement as they were before the speed work (frozen copy).

Why: the speed work replaced per-job loops and placement scans with
vectorised and cached versions that must return exactly the same plans.
Tests (``tests/test_policy_equivalence.py``) plan seeded random snapshots and
snapshot sequences with both and compare. Only the modules that changed are
copied; the rest (allocation, budget, snapshot) is imported from ``powerflow``.
Never edit these files except to follow a deliberate, justified change of the
plans.
"""
