"""Task folders: one reader (raw files → Documents) per task, plus its config."""
