"""Stage 3b, select (input.sources): which documents go into the output and how many times
(raypack.mixture), on the runner's tasks between tokenizing and planning.

    each source's tokens and tokens by key bin (tokenize summaries, folded by the driver: Totals)
      ─▶ targets (a ConfigError when a source cannot meet its own) ─▶ the boundary bin of each
         source that takes a seeded subset
      ─boundary tasks (a run of such shards each; none when no source takes a subset)─▶ the keys and
         lengths of the documents in those bins ─▶ each source's Rule (driver)
      ─select tasks (a run of shards each, the exchange's runs: M <= W)─▶ each shard's final index
         (a row a copy, -1 for a document left out), each run's item histogram by copy layer, the
         selection's stats and per-source counts ─▶ Totals, in place of the tokenize stage's

Tasks read the shards' staged index files (the tokenize stage's: ~40 bytes a document), never
tokens, and write each shard's index once; a retried task reads the staged file again. The driver
holds 512 KB a source (key bins), the boundary documents (~documents / 65,536 a source that takes a
subset, 16 bytes each) and one histogram a run and copy layer. Copies are made by the assign tasks
(raypack.pipeline.place.assign) with the same Rule: the histogram and the items agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.corpus.metadata import conform
from raypack.corpus.units import WorkUnit
from raypack.dataset.layout import index_path
from raypack.engine import Runner, transient
from raypack.metrics import DocStats
from raypack.mixture import (
    KEY_BITS,
    Cut,
    Rule,
    Target,
    boundary_bin,
    copies,
    copy_tokens,
    cut,
    kept,
    rule_for,
    subset_goal,
    targets,
    unit_keys,
)
from raypack.packing import item_histogram
from raypack.pipeline.tokenize.summary import Totals, write_index
from raypack.storage import resolve

__all__ = ["SOURCE_COUNTS", "Selection", "plan_selection", "run_selection", "select", "source_table"]

# What a select task counts of each source (summed over tasks).
# tokens: as tokenized; kept: what pack.overflow keeps of them (raypack.mixture.kept); selected: the
# copies' kept tokens; partial: the tokens of a partial copy (the cut's document's, Rule.partial_tokens).
SOURCE_COUNTS = (
    "documents",
    "tokens",
    "kept",
    "copies",
    "selected",
    "placed",
    "truncated",
    "left_out",
    "partial",
)


@dataclass(frozen=True)
class Selection:
    """The mixture's rules: what every task that makes items (assign, sharded) applies."""

    seed: int
    rules: dict[str, Rule]
    targets: dict[str, Target] = field(default_factory=dict)
    seq_len: int = 1 << 62
    overflow: str = "split"
    """pack's: which documents keep no token (raypack.mixture.copies)."""

    @property
    def layers(self) -> int:
        """The most copies of one document (at least 1)."""
        return max([1, *(r.layers for r in self.rules.values())])

    def copies(self, unit: WorkUnit, docs: pa.Table | pa.RecordBatch) -> Copies:
        """The copies of each document of a unit (`docs`: some of its rows of schema.TOKENIZED or
        DOCUMENTS: each document's file, row and length)."""
        files, rows = (docs.column(c).to_numpy() for c in ("file", "row"))
        rule = self.rules[unit.source]
        keys = unit_keys(self.seed, unit.relpaths, files, rows)
        lengths = docs.column("length").to_numpy()
        return Copies(rule, keys, copies(rule, keys, kept(lengths, self.seq_len, self.overflow)), lengths)


@dataclass(frozen=True)
class Copies:
    """A run of documents' copies under their source's Rule."""

    rule: Rule
    keys: np.ndarray
    n: np.ndarray
    """int32 copies of each document."""
    lengths: np.ndarray

    def layer(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices of the documents with a copy in layer c, the tokens each such copy holds: the
        document's length, but a partial copy's first tokens: mixture.copy_tokens)."""
        chosen = np.flatnonzero(self.n > c)
        return chosen, copy_tokens(self.rule, self.keys[chosen], self.lengths[chosen], c)


def _read_staged(cfg: JobConfig, shard: WorkUnit, metadata: bool = False) -> pa.Table:
    """A unit's staged index: its documents' ids, places and lengths, and with `metadata` their
    metadata where the unit kept some."""
    fs, inner = resolve(index_path(cfg.output.path, shard.index, staged=True), cfg.storage)
    columns = ["doc_id", "row", "length", "file"]
    if metadata and shard.reading.metadata_fields:
        columns.append(schema.METADATA)
    with fs.open_input_file(inner) as f:
        return pq.read_table(f, columns=columns)


def boundary_documents(
    cfg: JobConfig, shards: list[WorkUnit], bins: dict[str, int], patterns: tuple[str, ...] | None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Task: for each source in `bins`, the keys and lengths of its documents (in these shards)
    whose key falls in its boundary bin."""
    with transient(patterns):
        found: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in bins}
        for shard in shards:
            if shard.source not in bins:
                continue
            index = _read_staged(cfg, shard)
            files, rows = index.column("file").to_numpy(), index.column("row").to_numpy()
            keys = unit_keys(cfg.pack.seed, shard.relpaths, files, rows)
            hit = (keys >> np.uint64(64 - KEY_BITS)).astype(np.int64) == bins[shard.source]
            length = kept(index.column("length").to_numpy()[hit], cfg.pack.seq_len, cfg.pack.overflow)
            found[shard.source].append((keys[hit], length))
        return {
            s: (
                np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.uint64),
                np.concatenate([n for _, n in parts]) if parts else np.zeros(0, np.int64),
            )
            for s, parts in found.items()
        }


def plan_selection(cfg: JobConfig, shards: list[WorkUnit], totals: Totals, runner: Runner) -> Selection:
    """Each source's target (ConfigError when one cannot be met) and Rule: boundary tasks place the
    cut of every source that takes a seeded subset."""
    available = totals.source_tokens()
    tgt = targets(cfg.input.sources, available, cfg.input.tokens)
    goals = {name: subset_goal(t) for name, t in tgt.items() if subset_goal(t) > 0}
    where = {name: boundary_bin(totals.key_tokens[name], goal) for name, goal in goals.items()}
    thresholds: dict[str, Cut] = {}
    # Under split a partial copy of whole chunks may end a subset (each chunk fills a pack alone).
    chunk = cfg.pack.seq_len if cfg.pack.overflow == "split" else 0
    if where:
        bins = {name: b for name, (b, _) in where.items()}
        runs = _runs(shards, totals, set(bins))
        found = runner.map(boundary_documents, [(cfg, run, bins, runner.patterns) for run in runs])
        for name, goal in goals.items():
            keys = np.concatenate([f[name][0] for f in found])
            lengths = np.concatenate([f[name][1] for f in found])
            b, before = where[name]
            thresholds[name] = cut(goal, before, keys, lengths, b, chunk)
    rules = {name: rule_for(name, t, thresholds.get(name)) for name, t in tgt.items()}
    return Selection(cfg.pack.seed, rules, tgt, cfg.pack.seq_len, cfg.pack.overflow)


def _runs(shards: list[WorkUnit], totals: Totals, sources: set[str] | None = None) -> list[list[WorkUnit]]:
    """The shards of each run (the exchange's), in order; only those of `sources` when given."""
    runs: list[list[WorkUnit]] = [[] for _ in range(len(totals.hists))]
    for s in shards:
        if sources is None or s.source in sources:
            runs[int(totals.run_of_shard[s.index])].append(s)
    return [r for r in runs if r] if sources is not None else runs


def select_run(
    cfg: JobConfig,
    selection: Selection,
    shards: list[WorkUnit],
    patterns: tuple[str, ...] | None,
    kinds: dict[str, str],
) -> dict[str, Any]:
    """Task: the final index of each shard of a run (a row a copy of each document, in document
    order then copy order; -1 for a document left out; its metadata of the dataset's `kinds`,
    raypack.pipeline.tokenize.metadata), and the run's item histogram by copy layer, stats,
    per-shard items and tokens, and per-source counts."""
    with transient(patterns):
        seq_len, overflow = cfg.pack.seq_len, cfg.pack.overflow
        layers = selection.layers
        hists = np.zeros((layers, seq_len + 1), dtype=np.int64)
        stats = DocStats()
        counts: dict[str, dict[str, int]] = {}
        per_shard: dict[int, tuple[int, int]] = {}
        for shard in shards:
            index = _read_staged(cfg, shard, metadata=bool(kinds))
            length = index.column("length").to_numpy()
            chosen_by = selection.copies(shard, index)
            n = chosen_by.n
            reps = np.maximum(n, 1)  # a left-out document keeps one row, copy -1
            first = np.cumsum(reps) - reps
            take = np.repeat(np.arange(len(n)), reps)
            copy = (np.arange(len(take)) - first[take]).astype(np.int32)
            copy[n[take] == 0] = -1
            chunks = np.zeros(len(take), dtype=np.int32)
            placed = np.zeros(len(take), dtype=np.int64)
            shard_items = shard_tokens = truncated = partial = selected = 0
            for c in range(layers):
                chosen, tokens = chosen_by.layer(c)
                if not len(chosen):
                    break
                items = cfg.pack.make_items(tokens)
                hists[c] += item_histogram(items.span, seq_len)
                cut_short = tokens < length[chosen]  # a partial copy: a truncation of its document
                layer = DocStats.from_items(items, cut=cut_short)
                stats = stats + layer
                at = first[chosen] + c
                chunks[at] = np.diff(items.doc_start)
                placed[at] = items.placed_per_doc()
                shard_items += items.num_items
                shard_tokens += layer.tokens
                truncated += layer.truncated
                partial += int(tokens[cut_short].sum())
                selected += int(kept(tokens, seq_len, overflow).sum())
            taken = pa.array(take)
            metadata = None
            if kinds:
                had = index.column(schema.METADATA) if schema.METADATA in index.column_names else None
                metadata = conform(had, index.num_rows, kinds).take(taken)
            write_index(
                cfg,
                shard.shard,
                index.column("doc_id").take(taken),
                index.column("row").take(taken),
                index.column("length").take(taken),
                chunks,
                placed,
                copy,
                index.column("file").take(taken),
                metadata=metadata,
            )
            per_shard[shard.index] = (shard_items, shard_tokens)
            tally = counts.setdefault(shard.source, dict.fromkeys(SOURCE_COUNTS, 0))
            tally["documents"] += len(n)
            tally["tokens"] += int(length.sum())
            tally["kept"] += int(kept(length, seq_len, overflow).sum())
            tally["copies"] += int(n.sum())
            tally["selected"] += selected
            tally["placed"] += shard_tokens
            tally["truncated"] += truncated
            tally["partial"] += partial
            tally["left_out"] += int(np.count_nonzero(n == 0))
        return {"hists": hists, "stats": stats.to_json(), "counts": counts, "shards": per_shard}


def run_selection(
    cfg: JobConfig, shards: list[WorkUnit], totals: Totals, selection: Selection, runner: Runner
) -> dict[str, dict[str, int]]:
    """Select tasks over every run; their histograms, stats and counts replace the tokenize stage's
    in `totals`. Returns the per-source counts (SOURCE_COUNTS)."""
    runs = [(r, run) for r, run in enumerate(_runs(shards, totals)) if run]
    hists = np.zeros((len(totals.hists), selection.layers, cfg.pack.seq_len + 1), dtype=np.int64)
    stats = DocStats()
    items = np.zeros_like(totals.items)
    tokens = np.zeros_like(totals.tokens)
    counts: dict[str, dict[str, int]] = {}
    kinds = totals.metadata(cfg.input.metadata_columns) if cfg.input.metadata_columns else {}
    calls = [(cfg, selection, run, runner.patterns, kinds) for _, run in runs]
    for i, out in runner.unordered(select_run, calls):  # folded as they finish: one run's at a time
        hists[runs[i][0]] = out["hists"]
        stats = stats + DocStats.from_json(out["stats"])
        for shard, (n_items, n_tokens) in out["shards"].items():
            items[shard], tokens[shard] = n_items, n_tokens
        for source, c in out["counts"].items():
            mine = counts.setdefault(source, dict.fromkeys(SOURCE_COUNTS, 0))
            for k, v in c.items():
                mine[k] += v
    totals.selected(hists, stats, items, tokens)
    return counts


def source_table(selection: Selection, counts: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """A row a source, by name: what the config asked, its target, what it gave; for the summary,
    metrics.json, the manifest and the report."""
    selected = sum(c["selected"] for c in counts.values())
    rows = []
    for name in sorted(selection.rules):
        t, c, rule = (
            selection.targets[name],
            counts.get(name, dict.fromkeys(SOURCE_COUNTS, 0)),
            selection.rules[name],
        )
        rows.append(
            {
                "name": name,
                "asked": t.asked,
                "max_repeat": t.cap,
                **c,
                "target": t.target,
                "target_share": t.share,
                "share": c["selected"] / selected if selected else 0.0,
                "repetition": c["selected"] / c["kept"] if c["kept"] else 0.0,
                "off_target": c["selected"] - t.target,
                "rule": rule.to_dict(),
            }
        )
    return rows


def select(
    cfg: JobConfig, units: list[WorkUnit], totals: Totals, runner: Runner
) -> tuple[Selection, list[dict[str, Any]]]:
    """The stage: each source's rule (a ConfigError when a target cannot be met) and the select tasks,
    whose histograms and counts take the tokenize stage's place in `totals`; the sources' table."""
    selection = plan_selection(cfg, units, totals, runner)
    return selection, source_table(selection, run_selection(cfg, units, totals, selection, runner))
