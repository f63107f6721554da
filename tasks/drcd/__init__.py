"""DRCD span-extraction reading comprehension (traditional Chinese, SQuAD-style)."""
