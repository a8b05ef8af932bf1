"""Test setup: import shortconv from the source tree unless it is installed.

Run from the repository root (README):
    SHORTCONV_LIBRARY=build/lib/libshortconv.so PYTHONPATH=python python -m pytest -q tests/python
Without PYTHONPATH the source tree's python/ is used when no installed package is found.
"""
import os
import sys

import torch

# The CPU backend runs exec.num_threads = torch.get_num_threads() threads.  The
# tests use tiny problems, where an OpenMP team on a busy 2-core machine costs
# far more than the work; one thread keeps the suite fast.  SHORTCONV_TEST_THREADS
# overrides; test_forward.py::test_thread_count_does_not_change_results uses 2.
torch.set_num_threads(int(os.environ.get("SHORTCONV_TEST_THREADS", "1")))

try:
    import shortconv  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def pytest_report_header(config):
    import torch

    import shortconv

    return "shortconv: torch %s, library %s, custom ops %s, cuda %s" % (
        torch.__version__, shortconv.library_path,
        "registered" if shortconv.HAS_CUSTOM_OPS else "absent (autograd.Function fallback)",
        torch.cuda.is_available())
