"""THUCNews news classification."""
