"""Pretraining groundwork: the streamed, rank-sharded document corpus (`corpus`)."""
