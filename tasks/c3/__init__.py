"""C3 multiple-choice reading comprehension (Chinese)."""
