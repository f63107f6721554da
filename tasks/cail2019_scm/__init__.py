"""CAIL2019-SCM similar case matching (Chinese legal documents)."""
