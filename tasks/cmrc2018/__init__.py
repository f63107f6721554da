"""CMRC2018 span-extraction reading comprehension (Chinese, SQuAD-style)."""
