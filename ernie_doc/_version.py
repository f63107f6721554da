"""The one place the version is written (setup.py and CITATION.cff read it)."""
__version__ = "0.1.0"
