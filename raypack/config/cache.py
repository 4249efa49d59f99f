"""cache: the token store, where tokenized work units are kept for any later job to reuse
(raypack.dataset.store)."""

from __future__ import annotations

from dataclasses import dataclass

from raypack.errors import ConfigError

__all__ = ["CacheConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheConfig:
    """The token store: tokenized work units kept for any later job to reuse (docs/token-store.md)."""

    path: str | None = None
    """A directory (local, or s3://bucket/prefix) of token files that every `raypack pack` or
    `rebuild` naming it reads from and adds to: a unit whose key is there is not tokenized again,
    so a repack at another seq_len, algorithm, seed or format, or of the same corpus copied to
    another place, pays for assign and write only. Keys are by content (each input file's SHA-256,
    or its object store ETag and size) with the unit's range, its path relative to the input root
    (document ids hold it) and every tokenizer and reading setting. Several jobs may fill one store
    at once. Never pruned by a job: `raypack cache prune`. None: a pack tokenizes into its staging
    area (removed at the end); a rebuild keeps its store under its output root (`_cache/tokens/`)."""

    def __post_init__(self) -> None:
        if self.path is not None and not self.path.strip():
            raise ConfigError("cache.path is empty: name a directory, or leave cache out")
