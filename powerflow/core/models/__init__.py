"""Performance models (paper §4): step time and energy per iteration.

Pure functions and frozen dataclasses over numpy; fitting with scipy. No I/O
beyond JSON (de)serialisation of fitted parameters, reading the shipped priors
and the samples CSV. Modules: ``throughput`` and ``energy`` (the equations),
``params`` (fitted parameters, JSON), ``fitted`` (``FittedModel``, a
``PerfModel``), ``fitting`` (dense, prior-anchored and online fits),
``priors``, ``derived`` (power, remaining JCT/energy, best clock, Pareto
frontier), ``metrics`` (MAPE, 90/10 split), ``samples``, ``protocol``.
"""
