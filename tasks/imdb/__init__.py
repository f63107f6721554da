"""IMDB sentiment classification."""
