"""What a rebuild root remembers across its runs (`_cache/backends.json`): that the fast encoder, as
installed, gave other ids than tokenizers for a tokenizer there. A later run there does not choose it
again (the self-check's probes and sample had passed, and the in-run check caught it): this is the
one state a run leaves for the next besides the dataset and its token store, and it is the root's,
on its storage, never the process's."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from raypack.dataset.layout import CACHE
from raypack.errors import ConfigError
from raypack.storage import exists, join, read_bytes, write_bytes_atomic
from raypack.text.backends import Choice, fastokens_version, reference_version

__all__ = ["BACKENDS", "memory_of", "remember_failover", "remembered_failover"]

BACKENDS = "backends.json"


def memory_of(root: str) -> str:
    """Where a rebuild root keeps it: beside its token store."""
    return join(root, CACHE, BACKENDS)


def remember_failover(path: str, choice: Choice, tok: Any, reason: str, storage: Any = None) -> None:
    """Record at `path` (a rebuild root's) that `choice` gave other ids than tokenizers for this
    tokenizer: later runs there do not choose it again (remembered_failover)."""
    record = {
        "tokenizer_sha256": tok.sha256,
        "backend": choice.label,
        "reason": reason,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_bytes_atomic(path, json.dumps(record, indent=2).encode(), storage)


def remembered_failover(path: str, requested: str, tok: Any, storage: Any = None) -> Choice | None:
    """tokenizers, when `path` records that the fast backend as installed now gave other ids than
    tokenizers for this tokenizer in an earlier run (a ConfigError when tokenizer.backend asks for
    it by name); None when it records nothing that applies (another tokenizer, another fastokens
    version: worth its self-check again)."""
    if requested == "tokenizers" or not exists(path, storage):
        return None
    record = json.loads(read_bytes(path, storage))
    fast = f"fastokens {fastokens_version()}"
    if record.get("tokenizer_sha256") != tok.sha256 or record.get("backend") != fast:
        return None
    why = (
        f"{fast} gave other ids than tokenizers for this tokenizer in an earlier run here ({record['at']}): "
        f"{record['reason']}"
    )
    if requested == "fastokens":
        raise ConfigError(f"tokenizer.backend fastokens: {why}; use auto or tokenizers")
    return Choice("tokenizers", reference_version(), why)
