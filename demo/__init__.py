"""Built-in demo model: a tiny hybrid config, a real BPE tokenizer with a chat template."""
