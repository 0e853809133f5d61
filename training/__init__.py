"""Rebuilding the embedded default model: corpus, tokenizer, training and packaging (not installed)."""
