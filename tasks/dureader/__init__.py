"""DuReader 2.0 multi-document reading comprehension, converted to span extraction."""
