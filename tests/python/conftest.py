"""Test setup: import shortconv from the source tree unless it is installed.

Run from the repository root (README):
    SHORTCONV_LIBRARY=build/lib/libshortconv.so PYTHONPATH=python python -m pytest -q tests/python
Without PYTHONPATH the source tree's python/ is used when no installed package is found.
"""
import os
import sys

try:
    import shortconv  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
