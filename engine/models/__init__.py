"""Model directories: the backend table, the directory format, the tokenizer, the embedded architecture."""
