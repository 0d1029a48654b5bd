"""Speed and accuracy targets: one ``<topic>_bench.py`` module per part, each with ``main()``.

``python -m benchmarks`` (or ``make bench``) runs them all; they are never unit tests.
"""
