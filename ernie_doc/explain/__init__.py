"""What a prediction rests on: which segments and words drove it, and how far back a model looks."""
