"""What requant knows about models: the Qwen3 and Qwen3-MoE configs (qwen3, qwen3_moe), the
tokenizer (tokenizer) and the built-in prompts (prompts). Imports only requant.io and
requant.errors (tests/test_layers.py); the synthetic checkpoint maker, which writes checkpoints,
is requant.checkpoint.synthetic."""
