"""Text in, ids out: the tokenizer, its encoders, where a long text may be cut, offsets, chat templates."""
