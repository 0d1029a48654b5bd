"""Scheduling policies and placement: plain data in, one plan out.

No clock, no I/O, no Kubernetes: the snapshot carries time and models.
"""
