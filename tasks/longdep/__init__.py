"""longdep: a synthetic long-dependency document classification task (see reader.py)."""
