"""What a trained model's prediction rests on: attributions and effective context."""
