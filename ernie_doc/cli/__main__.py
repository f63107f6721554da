"""`python -m ernie_doc.cli COMMAND ...`, and the script paddle's launcher runs for
`ernie-doc COMMAND --nproc N` (a file path, with this folder as sys.path[0])."""
import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        # run as a file: this folder's modules (export.py ...) must not shadow top-level
        # modules of the same name; the package is found where it is installed
        sys.path[0] = os.path.dirname(os.path.dirname(here))
    from ernie_doc.cli import main
    sys.exit(main())
