#!/usr/bin/env python
"""tools/plan.py: `ernie-doc plan` from a source checkout, installed or not (the code:
ernie_doc/cli/plan.py; `--help` for its arguments): a run's memory per device and GPU-hours,
estimated from its config."""
import os
import sys
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ernie_doc.cli.plan import *  # noqa: E402,F401,F403  (callers import from here)
from ernie_doc.cli.plan import command, main  # noqa: E402,F401

if __name__ == "__main__":
    from ernie_doc.cli import run_command  # Ctrl-C: one line, not a traceback
    sys.exit(run_command(command))
