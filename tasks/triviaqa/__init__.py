"""TriviaQA reading comprehension, Wikipedia setting (span extraction, distant supervision)."""
