"""Performance models (paper §4): step time and energy per iteration.

Pure functions and plain dataclasses over numpy; fitting with scipy. No I/O
beyond JSON (de)serialisation of fitted parameters.
"""
