"""Data mixtures (input.sources): how many copies of each document go into the output so that each
source meets its target. Pure functions; raypack.pipeline.place.select runs them on Ray.

Targets (`targets`). A source asks for `tokens: T` (T), `repeat: r` (r × its tokens), `weight: w`
(a share w of the output), or nothing (its tokens once). Weights alone are relative (normalized), and
the output's size is input.tokens or, by default, the largest at which no source goes over its
max_repeat (so one source is used to its cap: with the default cap 1, the scarcest source whole).
Beside repeat/tokens sources, weights are shares of the whole and sum below 1: the whole is then the
fixed sources' tokens / (1 - the weights). A target over max_repeat × a source's tokens is a
ConfigError that gives the numbers (known once tokenized: before any packing).

Selection, per source, in kept tokens (`kept`: what pack.overflow leaves of each document, so that
shares are of the output's tokens: under truncate a document gives at most seq_len, under drop a
too-long one gives none): with r = target / available, every document gets k = floor(r) copies and a
seeded subset of them one more. The subset is the documents whose 64-bit key u = splitmix64(seed,
file, row) is below a threshold θ, taken in key order, and the cut lands where the subset's tokens
come closest to the goal (r - k) × available. A cut between two documents alone can leave a source
of documents of 3% of the output 2.9 points off its share; so under split the document the goal falls
in may give a partial copy: its first m chunks of seq_len tokens (m ≥ 1, fewer than its own). Each
such chunk fills a pack alone, as a split document's chunks do, so no document ever follows a
partial copy inside a pack (Megatron's and OLMo's readers find documents by EOS, which a partial copy
lacks). A source's tokens are then within half of min(seq_len, that document) of its target; the
partial copy is counted as a truncation and reported (Rule.partial_tokens). Keys are fixed per
document: the subset depends on nothing but the seed and the corpus (not on workers, shards' order
or batches).

Finding θ without a list of every document: each tokenize task reports its shard's tokens by the top
KEY_BITS bits of u (token_bins: a histogram of 65,536 bins, sparse), the driver sums a source's and
finds the bin where the running total crosses the goal (boundary_bin), and then gathers the keys
and lengths of the documents of that one bin alone (~documents / 65,536 of them) to place the cut
(cut). Copies are made where items are made (raypack.pipeline.place.assign): never tokenized twice.
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
    "Cut",
    "Rule",
    "Target",
    "boundary_bin",
    "copies",
    "copy_tokens",
    "cut",
    "document_keys",
    "kept",
    "rule_for",
    "source_cells",
    "subset_goal",
    "targets",
    "token_bins",
    "unit_keys",
]

# The columns of a mixture's table, in the summary and the report
# (raypack.pipeline.place.select.source_table).
SOURCE_HEADER = (
    "source",
    "asked",
    "documents",
    "tokens in",
    "tokens kept",
    "target",
    "tokens out",
    "share",
    "target share",
    "repeat",
    "left out",
    "truncated",
    "partial copy",
)


def source_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """A source's row of the table (SOURCE_HEADER's columns), as text."""
    return (
        row["name"],
        row["asked"],
        f"{row['documents']:,}",
        f"{row['tokens']:,}",
        f"{row.get('kept', row['tokens']):,}",
        f"{row['target']:,}",
        f"{row['selected']:,}",
        f"{100 * row['share']:.2f}%" + (" !" if row.get("share_warning") else ""),
        f"{100 * row['target_share']:.2f}%",
        f"{row['repetition']:.2f}x",
        f"{row['left_out']:,}",
        f"{row['truncated']:,}",
        f"{partial:,} tokens" if (partial := row.get("rule", {}).get("partial_tokens", 0)) else "none",
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
    """Its documents' kept tokens (as tokenized, BOS/EOS included, what pack.overflow keeps of them:
    `kept`), before selection."""
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
    fixed, asked = _sized_without_weight(sources, available)
    weighted = [s for s in sources if s.weight is not None]
    empty = [s.name for s in weighted if not available[s.name]]
    if empty:
        raise ConfigError(
            f"input.sources: {', '.join(empty)} has a weight but no tokens (every record rejected, see "
            "rejects/, or every document longer than seq_len under pack.overflow drop): no share of the "
            "output can come from it"
        )
    shares, total = _shares_and_total(weighted, fixed, available, total)
    for s in weighted:
        fixed[s.name] = math.floor(shares[s.name] * total)
        asked[s.name] = f"weight {s.weight:g}"
    out = {}
    for s in sources:
        a, t = available[s.name], fixed[s.name]
        out[s.name] = Target(s.name, a, t, t / total if total else 0.0, asked[s.name], s.cap)
    over = [why for s in sources if (why := _over_cap(out[s.name]))]
    if over:
        raise ConfigError(
            "input.sources: a target cannot be met without repeating a source more than allowed: "
            + "; ".join(over)
            + " (raise its max_repeat, or lower its weight or budget, or input.tokens)"
        )
    return out


def _sized_without_weight(
    sources: Sequence[SourceConfig], available: dict[str, int]
) -> tuple[dict[str, int], dict[str, str]]:
    """The target of each source sized by tokens, repeat or nothing (whole), and what each source
    but a weighted one asked, in words."""
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
    return fixed, asked


def _shares_and_total(
    weighted: list[SourceConfig], fixed: dict[str, int], available: dict[str, int], total: int | None
) -> tuple[dict[str, float], int]:
    """The weighted sources' shares of the output and the output's tokens. Weights alone are
    relative, and the output is `total`, else the most they give with none over its max_repeat;
    beside sized sources they are shares of the whole, which the sized ones' targets fix."""
    wsum = sum(float(s.weight or 0) for s in weighted)
    if weighted and not fixed:
        shares = {s.name: float(s.weight or 0) / wsum for s in weighted}
        if total is None:
            total = min(math.floor(s.cap * available[s.name] / shares[s.name]) for s in weighted)
        return shares, total
    if weighted:
        if wsum >= 1:
            raise ConfigError(
                f"input.sources: beside sources sized by repeat or tokens ({', '.join(fixed)}), weights are "
                f"shares of the whole and must sum below 1; they sum to {wsum:g}"
            )
        return {s.name: float(s.weight or 0) for s in weighted}, round(sum(fixed.values()) / (1 - wsum))
    return {}, sum(fixed.values())


def _over_cap(target: Target) -> str:
    """Why a source's target needs more than its max_repeat allows of its kept tokens; "" if not."""
    a, t, cap = target.available, target.target, target.cap
    if t > cap * a and not a:
        return (
            f"{target.name} ({target.asked}) needs {t:,} tokens but keeps none (every record rejected, see "
            "rejects/, or every document longer than seq_len under pack.overflow drop)"
        )
    if t > cap * a:
        return (
            f"{target.name} ({target.asked}) needs {t:,} tokens, {t / a:.2f}× the {a:,} tokens it keeps, "
            f"over its max_repeat {cap:g}"
        )
    return ""


def boundary_bin(tokens_by_bin: np.ndarray, goal: int) -> tuple[int, int]:
    """The bin where the running total of a source's tokens (by key bin, dense int64[BINS]) first
    reaches `goal`, and the tokens of the bins before it. goal must be in (0, total)."""
    running = np.cumsum(tokens_by_bin)
    b = int(np.searchsorted(running, goal, side="left"))
    return b, int(running[b - 1]) if b else 0


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a source's seeded subset ends: every document with a key below `threshold`, and the
    first `partial_tokens` (whole chunks of seq_len) of the one whose key is `partial_key` (0
    tokens: none)."""

    threshold: int
    partial_key: int = 0
    partial_tokens: int = 0


def cut(goal: int, before: int, keys: np.ndarray, lengths: np.ndarray, bin_index: int, chunk: int = 0) -> Cut:
    """The Cut whose tokens come closest to `goal`: `before` tokens lie in the bins below
    `bin_index`, whose documents' keys and kept lengths are given. In key order, the documents whose
    running total stays within the goal are taken whole; the next one is taken whole, not at all, or
    (`chunk` > 0: seq_len under overflow split) as its first m chunks, 1 <= m, m·chunk below its
    length, whichever lands nearest (ties: not at all, then whole). The threshold is a key in that
    bin, or the bin's end (2^64 for the last bin: every document)."""
    order = np.argsort(keys, kind="stable")
    ordered = np.asarray(lengths, dtype=np.int64)[order]
    totals = before + np.r_[0, np.cumsum(ordered)]
    end = (bin_index + 1) << (64 - KEY_BITS)
    j = int(np.searchsorted(totals, goal, side="right")) - 1  # totals[j] <= goal < totals[j + 1]
    if j >= len(order):
        return Cut(end)
    gap, size, key = goal - int(totals[j]), int(ordered[j]), int(keys[order[j]])
    after = int(keys[order[j + 1]]) if j + 1 < len(order) else end
    best, found = gap, Cut(key)
    if size - gap < best:
        best, found = size - gap, Cut(after)
    if chunk:
        for m in {gap // chunk, -(-gap // chunk)}:
            if m >= 1 and m * chunk < size and abs(gap - m * chunk) < best:
                best, found = abs(gap - m * chunk), Cut(key, key, m * chunk)
    return found


@dataclass(frozen=True, slots=True)
class Rule:
    """How many copies a source's documents get: `full`, plus one more below `threshold`, plus one
    more of the first `partial_tokens` tokens of the document whose key is `partial_key` (Cut)."""

    name: str
    full: int
    threshold: int
    """Exclusive bound on keys (0: no document gets the extra copy); < 2^64."""
    partial_key: int = 0
    partial_tokens: int = 0
    """The cut's document's copy in layer `full` holds only these first tokens, whole chunks of
    seq_len (0: no partial copy)."""

    @property
    def layers(self) -> int:
        """The most copies a document gets."""
        return self.full + (1 if self.threshold or self.partial_tokens else 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rule_for(name: str, target: Target, found: Cut | None) -> Rule:
    """A source's Rule from its target and, where it takes a subset, the Cut placed for it (None: no
    subset). A cut past every key (2^64) is one more full copy."""
    full = int(target.target // target.available) if target.available else 0
    if found is None:
        return Rule(name, full, 0)
    if found.threshold >= 1 << 64:
        return Rule(name, full + 1, 0)
    return Rule(name, full, found.threshold, found.partial_key, found.partial_tokens)


def subset_goal(target: Target) -> int:
    """Tokens the seeded subset of a source must give beyond its full copies (0: none)."""
    if not target.available:
        return 0
    return target.target - (target.target // target.available) * target.available


def copies(rule: Rule, keys: np.ndarray, kept_tokens: np.ndarray | None = None) -> np.ndarray:
    """int32 copies of each document (the cut's document's last copy is partial: copy_tokens). A
    document that keeps no token (`kept_tokens` 0: longer than seq_len under drop) has one copy
    whatever its key, which overflow drops: it counts as dropped once, as without a mixture, never
    as left out, so the dropped counts describe the corpus, not the seed and weights."""
    out = np.full(len(keys), rule.full, dtype=np.int32)
    if rule.threshold:
        out += (keys < np.uint64(rule.threshold)).astype(np.int32)
    if rule.partial_tokens:
        out += (keys == np.uint64(rule.partial_key)).astype(np.int32)
    if kept_tokens is not None:
        out[np.asarray(kept_tokens) == 0] = 1
    return out


def copy_tokens(rule: Rule, keys: np.ndarray, lengths: np.ndarray, layer: int) -> np.ndarray:
    """int64 tokens that copy `layer` of each document holds: its length, but the first
    partial_tokens of the cut's document in layer `full`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not rule.partial_tokens or layer != rule.full:
        return lengths
    return np.where(keys == np.uint64(rule.partial_key), np.minimum(lengths, rule.partial_tokens), lengths)


def kept(lengths: np.ndarray, seq_len: int, overflow: str) -> np.ndarray:
    """int64 tokens each document gives the output under pack.overflow (split: all; truncate: at
    most seq_len; drop: none past seq_len): what targets, shares and the cut count."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if overflow == "truncate":
        return np.minimum(lengths, seq_len)
    if overflow == "drop":
        return np.where(lengths <= seq_len, lengths, 0)
    return lengths
