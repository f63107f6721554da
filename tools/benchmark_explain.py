#!/usr/bin/env python
"""tools/benchmark_explain.py: the benchmark in benchmarks/explain.py, run from a source checkout
(benchmarks/ is never installed; `--help` for its arguments)."""
import os
import sys
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.explain import *  # noqa: E402,F401,F403  (callers import from here)
from benchmarks.explain import command, main  # noqa: E402,F401

if __name__ == "__main__":
    from ernie_doc.cli import run_command  # Ctrl-C: one line, not a traceback
    sys.exit(run_command(command))
