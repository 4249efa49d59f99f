"""raypack: turn sharded text corpora into packed token sequences for LLM training, on Ray."""

__version__ = "0.1.0"
