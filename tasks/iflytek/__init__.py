"""IFLYTEK app-description classification (CLUE / FewCLUE)."""
