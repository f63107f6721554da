"""Fine-tuning, pretraining and language-model runs: config, preparation, the loop, checkpoints."""
