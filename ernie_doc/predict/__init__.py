"""Prediction and export: a saved run's model on new documents (pipeline: the document kinds;
lm: the language model), the inputs they read and the outputs they write, and the exported
model (export: dygraph → a static program; engine: the Paddle Inference predictor that runs
it). Nothing here imports ernie_doc.training."""
