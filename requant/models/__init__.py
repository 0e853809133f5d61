"""What requant knows about models: the Qwen3 config (qwen3), the synthetic checkpoint generator
(synthetic, `python -m requant.models.synthetic`), the tokenizer (tokenizer) and the built-in
prompts (prompts)."""
