"""The checkpoint package's error, in a module of its own: io.py and safe_pickle.py both raise
it, and io.py reads .pdparams files through safe_pickle, so neither can own it without the two
importing each other."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or read; the message names the path."""
