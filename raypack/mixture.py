"""Data mixtures (input.sources): how many copies of each document go into the output so that each
source meets its target. Pure functions; raypack.pipeline.select runs them on Ray.

Targets (`targets`). A source asks for `tokens: T` (T), `repeat: r` (r × its tokens), `weight: w`
(a share w of the output), or nothing (its tokens once). Weights alone are relative (normalized), and
the output's size is input.tokens or, by default, the largest at which no source goes over its
max_repeat (so one source is used to its cap: with the default cap 1, the scarcest source whole).
Beside repeat/tokens sources, weights are shares of the whole and sum below 1: the whole is then the
fixed sources' tokens / (1 - the weights). A target over max_repeat × a source's tokens is a
ConfigError that gives the numbers (known once tokenized: before any packing).

Selection, per source: with r = target / available, every document gets k = floor(r) copies and a
seeded subset of them one more. The subset is the documents whose 64-bit key u = splitmix64(seed,
file, row) is below a threshold θ, placed so that the subset's tokens come closest to the goal
(r - k) × available: the documents are taken in key order and the cut falls between two of them, so
a source's tokens are within one document of its target (the cut's nearer side). Keys are fixed per
document: the subset depends on nothing but the seed and the corpus (not on workers, shards' order
or batches), and a larger share only adds documents to it.

Finding θ without a list of every document: each tokenize task reports its shard's tokens by the top
KEY_BITS bits of u (token_bins: a histogram of 65,536 bins, sparse), the driver sums a source's and
finds the bin where the running total crosses the goal (boundary_bin), and then gathers the keys
and lengths of the documents of that one bin alone (~documents / 65,536 of them) to place the cut
(cut). Copies are made where items are made (raypack.pipeline.assign): never tokenized twice.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raypack.config import SourceConfig
from raypack.errors import ConfigError

__all__ = [
    "BINS",
    "KEY_BITS",
    "SOURCE_HEADER",
    "Rule",
    "Target",
    "boundary_bin",
    "copies",
    "cut",
    "document_keys",
    "rule_for",
    "source_cells",
    "subset_goal",
    "targets",
    "token_bins",
    "unit_keys",
]

# The columns of a mixture's table, in the summary and the report (raypack.pipeline.select.source_table).
SOURCE_HEADER = (
    "source",
    "asked",
    "documents",
    "tokens in",
    "target",
    "tokens out",
    "share",
    "target share",
    "repeat",
    "left out",
)


def source_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """A source's row of the table (SOURCE_HEADER's columns), as text."""
    return (
        row["name"],
        row["asked"],
        f"{row['documents']:,}",
        f"{row['tokens']:,}",
        f"{row['target']:,}",
        f"{row['selected']:,}",
        f"{100 * row['share']:.2f}%",
        f"{100 * row['target_share']:.2f}%",
        f"{row['repetition']:.2f}x",
        f"{row['left_out']:,}",
    )


KEY_BITS = 16
BINS = 1 << KEY_BITS
_SHIFT = np.uint64(64 - KEY_BITS)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def document_keys(seed: int, relpath: str, rows: np.ndarray) -> np.ndarray:
    """uint64 key of each document of one file (relpath: its path under its source, as in the ids;
    rows: the documents' lines or rows in the file, which work units keep file-global)."""
    return _keys(np.uint64(_file_base(seed, relpath)), rows)


def unit_keys(seed: int, relpaths: list[str], files: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """document_keys of a work unit's documents, each by its own file (`files`: its number in
    `relpaths`, the unit's files; a run of small files holds several)."""
    if len(relpaths) == 1:
        return document_keys(seed, relpaths[0], rows)
    bases = np.asarray([_file_base(seed, r) for r in relpaths], dtype=np.uint64)
    return _keys(bases[np.asarray(files, dtype=np.int64)], rows)


def _file_base(seed: int, relpath: str) -> int:
    digest = hashlib.blake2b(f"{seed}\0{relpath}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _keys(base: np.ndarray | np.uint64, rows: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(base + np.asarray(rows, dtype=np.int64).astype(np.uint64) * _GOLDEN)


def token_bins(keys: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bins, tokens): the documents' tokens by the top KEY_BITS bits of their keys, non-empty bins."""
    bins = (keys >> _SHIFT).astype(np.int64)
    tokens = np.bincount(bins, weights=lengths, minlength=BINS).astype(np.int64)
    nonzero = np.flatnonzero(tokens)
    return nonzero, tokens[nonzero]


@dataclass(frozen=True, slots=True)
class Target:
    """One source's part of the mixture."""

    name: str
    available: int
    """Its documents' tokens (as tokenized: BOS/EOS included), before selection."""
    target: int
    """Tokens it is to give the output."""
    share: float
    """target / the output's tokens."""
    asked: str
    """What the config asked, in words (e.g. "weight 0.3", "repeat 2.5")."""
    cap: float
    """Its max_repeat."""

    @property
    def repeat(self) -> float:
        return self.target / self.available if self.available else 0.0


def targets(
    sources: Sequence[SourceConfig], available: dict[str, int], total: int | None = None
) -> dict[str, Target]:
    """Each source's target tokens (module docstring); ConfigError when a source cannot meet its
    target within max_repeat, or the weights and budgets contradict each other."""
    fixed: dict[str, int] = {}
    asked: dict[str, str] = {}
    for s in sources:
        a = available[s.name]
        if s.tokens is not None:
            fixed[s.name], asked[s.name] = s.tokens, f"tokens {s.tokens:,}"
        elif s.repeat is not None:
            fixed[s.name], asked[s.name] = math.floor(s.repeat * a), f"repeat {s.repeat:g}"
        elif s.weight is None:
            fixed[s.name], asked[s.name] = a, "whole"
    weighted = [s for s in sources if s.weight is not None]
    empty = [s.name for s in weighted if not available[s.name]]
    if empty:
        raise ConfigError(
            f"input.sources: {', '.join(empty)} has a weight but no tokens (every record rejected, see "
            "rejects/): no share of the output can come from it"
        )
    wsum = sum(float(s.weight or 0) for s in weighted)
    shares: dict[str, float] = {}
    if weighted and not fixed:
        shares = {s.name: float(s.weight or 0) / wsum for s in weighted}
        if total is None:
            total = min(math.floor(s.cap * available[s.name] / shares[s.name]) for s in weighted)
    elif weighted:
        if wsum >= 1:
            raise ConfigError(
                f"input.sources: beside sources sized by repeat or tokens ({', '.join(fixed)}), weights are "
                f"shares of the whole and must sum below 1; they sum to {wsum:g}"
            )
        shares = {s.name: float(s.weight or 0) for s in weighted}
        total = round(sum(fixed.values()) / (1 - wsum))
    else:
        total = sum(fixed.values())
    for s in weighted:
        fixed[s.name] = math.floor(shares[s.name] * total)
        asked[s.name] = f"weight {s.weight:g}"
    out = {}
    over = []
    for s in sources:
        a, t = available[s.name], fixed[s.name]
        out[s.name] = Target(s.name, a, t, t / total if total else 0.0, asked[s.name], s.cap)
        if t > s.cap * a:
            times = f"{t / a:.2f}× its" if a else "but it has no tokens; its"
            over.append(
                f"{s.name} ({asked[s.name]}) needs {t:,} tokens, {times} {a:,} tokens, over its max_repeat "
                f"{s.cap:g}"
            )
    if over:
        raise ConfigError(
            "input.sources: a target cannot be met without repeating a source more than allowed: "
            + "; ".join(over)
            + " (raise its max_repeat, or lower its weight or budget, or input.tokens)"
        )
    return out


def boundary_bin(tokens_by_bin: np.ndarray, goal: int) -> tuple[int, int]:
    """The bin where the running total of a source's tokens (by key bin, dense int64[BINS]) first
    reaches `goal`, and the tokens of the bins before it. goal must be in (0, total)."""
    running = np.cumsum(tokens_by_bin)
    b = int(np.searchsorted(running, goal, side="left"))
    return b, int(running[b - 1]) if b else 0


def cut(goal: int, before: int, keys: np.ndarray, lengths: np.ndarray, bin_index: int) -> int:
    """The threshold θ (exclusive) for the subset whose tokens come closest to `goal`: `before`
    tokens lie in the bins below `bin_index`, whose documents' keys and lengths are given. Returns
    a key in that bin, or the bin's end (2^64 for the last bin: every document)."""
    order = np.argsort(keys, kind="stable")
    totals = before + np.r_[0, np.cumsum(np.asarray(lengths, dtype=np.int64)[order])]
    j = int(np.argmin(np.abs(totals - goal)))
    if j < len(order):
        return int(keys[order[j]])
    return (bin_index + 1) << (64 - KEY_BITS)


@dataclass(frozen=True, slots=True)
class Rule:
    """How many copies a source's documents get: `full`, plus one more below `threshold`."""

    name: str
    full: int
    threshold: int
    """Exclusive bound on keys (0: no document gets the extra copy); < 2^64."""

    @property
    def layers(self) -> int:
        """The most copies a document gets."""
        return self.full + (1 if self.threshold else 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rule_for(name: str, target: Target, threshold: int | None) -> Rule:
    """A source's Rule from its target and, where it takes a subset, the cut placed for it (None:
    no subset). A cut past every key (2^64) is one more full copy."""
    full = target.target // target.available if target.available else 0
    if threshold is None:
        return Rule(name, int(full), 0)
    if threshold >= 1 << 64:
        return Rule(name, int(full) + 1, 0)
    return Rule(name, int(full), int(threshold))


def subset_goal(target: Target) -> int:
    """Tokens the seeded subset of a source must give beyond its full copies (0: none)."""
    if not target.available:
        return 0
    return target.target - (target.target // target.available) * target.available


def copies(rule: Rule, keys: np.ndarray) -> np.ndarray:
    """int32 copies of each document."""
    out = np.full(len(keys), rule.full, dtype=np.int32)
    if rule.threshold:
        out += (keys < np.uint64(rule.threshold)).astype(np.int32)
    return out
