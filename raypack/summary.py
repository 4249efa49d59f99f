"""The one table `raypack pack` prints at the end: what went in, what came out, what it cost."""

from __future__ import annotations

from typing import Any

from raypack.corpus.readers.records import CUT_KINDS
from raypack.dataset.manifest import describe_sample
from raypack.dataset.store import store_line
from raypack.formats import total_bytes
from raypack.metrics import PackingMetrics, slots_line
from raypack.mixture import SOURCE_HEADER, source_cells
from raypack.pipeline.job import JobResult
from raypack.pipeline.rebuild import RebuildResult
from raypack.text.account import backend_line, counted
from raypack.text.chat import chat_rows
from raypack.text.tokenizer import guessed

__all__ = ["format_rebuild", "format_summary"]


def format_summary(result: JobResult, command_seconds: float | None = None, timed: str = "") -> str:
    """The summary of a run; `command_seconds`: the whole command's time, start-up to exit, or what
    `timed` says it is (raypack demo: the job's, after its corpus and tokenizer are built)."""
    rows = [*_input_rows(result), *_packing_rows(result), *_run_rows(result, command_seconds, timed)]
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
    return text + ("\n" + sources_table(result.sources) if result.sources else "")


def _input_rows(result: JobResult) -> list[tuple[str, str]]:
    """Where the output went and what of the input it holds: documents, rejects, lost files and
    duplicate ids."""
    rows = [
        ("output", result.output),
        (
            "documents",
            f"{result.documents:,} ({counted(result.rejected_records, 'record')} rejected, see rejects/)"
            if result.rejected_records
            else f"{result.documents:,} (no record rejected)",
        ),
    ]
    if (trial := describe_sample(result.sample)) is not None:
        rows.append(("sample", trial))
    if result.lost_files:
        rows.append(
            (
                "lost files",
                f"{counted(result.lost_files, 'input file')} unreadable whole or in part (allowed)",
            )
        )
    if result.reject_reasons:
        rows.append(("rejects", _rejects_line(result.reject_reasons)))
    if result.duplicates and result.duplicates.ids:
        rows.append(
            (
                "duplicate ids",
                f"{result.duplicates.ids:,} ids on {result.duplicates.documents:,} documents "
                f"(all packed), e.g. {', '.join(result.duplicates.examples[:3])}",
            )
        )
    return rows


def _rejects_line(kinds: dict[str, int]) -> str:
    """Rejected records by kind, the most frequent first (as the job's messages and the report
    give them), each apart by "; " (a kind may hold commas: "record of N bytes, over ..."); then
    the documents the packing cut."""
    records = sorted(
        ((k, n) for k, n in kinds.items() if not k.startswith(CUT_KINDS)), key=lambda kn: (-kn[1], kn[0])
    )
    cut = {k: n for k, n in kinds.items() if k.startswith(CUT_KINDS)}
    parts = ["; ".join(f"{kind}: {n:,}" for kind, n in records)] if records else []
    if cut:
        listed = ", ".join(f"{kind}: {n:,}" for kind, n in cut.items())
        parts.append(f"documents packed in part or not at all: {listed}")
    return "; ".join(parts)


def _packing_rows(result: JobResult) -> list[tuple[str, str]]:
    """How the tokens were packed: tokens, items, packs, efficiency, the plans compared, the
    ratios, and the files written."""
    m = result.metrics
    rows = [
        ("tokens", f"{m.tokens:,} packed, {m.tokens_dropped:,} dropped"),
        ("items", f"{m.items:,} from {m.documents - m.documents_dropped:,} documents"),
        ("packs", _packs_line(m)),
        ("efficiency", f"{100 * m.efficiency:.4f}%  (padding ratio {m.padding_ratio:.5f})"),
    ]
    if m.alignment_padding:  # pack.pad_multiple: the padding it costs, apart from the packs' ends
        rows.append(("positions", slots_line(m)))
    if result.mode == "sharded":
        rows.append(
            ("global plan", f"{100 * result.global_efficiency:.4f}% with one bfd plan over all shards")
        )
    if result.comparison:
        compared = "; ".join(
            f"{c.algorithm} {c.packs:,} packs ({100 * c.efficiency:.4f}%)" for c in result.comparison
        )
        rows.append(("compared", compared + " (plans only)"))
    rows += [
        ("truncation ratio", f"{m.truncation_ratio:.4f}"),
        (
            "concatenation ratio",
            f"{m.concatenation_ratio:.2f} (Liu et al.'s r_cat: "
            f"{m.documents:,} documents / {m.packs:,} packs)",
        ),
        (
            "documents per pack",
            f"{m.documents_per_pack:.2f} on average (Krell et al.'s packing factor), {m.max_depth:,} at most"
            + (f" (pack.max_depth {result.max_depth_cap})" if result.max_depth_cap else ""),
        ),
        ("files", _files_line(result)),
    ]
    return rows


def _packs_line(m: PackingMetrics) -> str:
    if m.lengths_vary:
        each = " (one chunk each)" if m.algorithm == "decompose" else ""
        return f"{m.packs:,} of several lengths up to {m.seq_len}{each}, {m.slots:,} positions in all"
    return f"{m.packs:,} of {m.seq_len} (lower bound {m.lower_bound:,}: {m.packs_over_lower_bound:.5f}x)"


def _specials_rows(result: JobResult) -> list[tuple[str, str]]:
    """The BOS, EOS (those the documents take) and pad a job guessed, and how: no row when each was
    stated (by the config, the model's files, or the post-processor)."""
    tok = result.tokenizer
    said, settings = [], []
    for key, name, setting in (
        ("bos", "BOS", "tokenizer.bos_id"),
        ("eos", "EOS", "tokenizer.eos_id"),
        ("pad", "pad", "output.pad_id"),
    ):
        source = str(tok.get(f"{key}_source", ""))
        if result.config.takes(key) and guessed(source):
            said.append(f"{name} {tok.get(f'{key}_id')}, {source}")
            settings.append(setting)
    if not said:
        return []
    return [("special tokens", f"{'; '.join(said)}: {' / '.join(settings)} chooses another")]


def _run_rows(result: JobResult, command_seconds: float | None, timed: str) -> list[tuple[str, str]]:
    """What else the run did and met: EOS inside documents, chat data, the token store or the
    token cache, the tokenizer's backend, the report, and the time."""
    rows = _specials_rows(result)
    stray = int(result.output_format.get("stray_eos", 0))
    if stray:
        rows.append(
            (
                "EOS inside documents",
                f"{stray:,} EOS tokens inside documents (not at their ends): "
                f"{result.output_format['name']}'s trainer cuts a document there",
            )
        )
    if result.chat is not None:
        rows += chat_rows(result.chat)
    shards = result.shards_reused + result.shards_tokenized
    if result.token_store is not None:
        rows.append(("token store", store_line(result.token_store, shards)))
    elif result.shards_reused:
        rows.append(
            (
                "shards",
                f"{shards:,}: {result.shards_reused:,} from the token cache, "
                f"{result.shards_tokenized:,} tokenized",
            )
        )
    if result.backend:
        rows.append(("tokenizer", backend_line(result.backend)))
    rows.append(("report", result.report or "not written (see the warning above)"))
    rows.append(("time", _time_line(result, command_seconds, timed)))
    return rows


def sources_table(sources: list[dict[str, Any]]) -> str:
    """The mixture, a line a source (SOURCE_HEADER's columns): what the config asked, its tokens in and
    kept (what pack.overflow keeps: targets count these), its target and tokens out, its realized
    share against its target's, how many times its kept tokens were taken, its documents left out,
    its truncated copies and its partial copy."""
    rows: list[tuple[str, ...]] = [SOURCE_HEADER]
    for r in sources:
        rows.append(source_cells(r))
    widths = [max(len(row[i]) for row in rows) for i in range(len(SOURCE_HEADER))]
    lines = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines + [f"! {r['share_warning']}" for r in sources if r.get("share_warning")])


def _time_line(result: JobResult, command_seconds: float | None, timed: str = "") -> str:
    """The whole command's time, the stages' part of it, and where the tasks ran."""
    total = sum(result.stage_seconds.values())
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in result.stage_seconds.items())
    runner = result.runner
    where = f"; on {runner['cpus']} {'local processes' if runner['name'] == 'local' else 'Ray CPUs'}"
    if command_seconds is None:
        return f"{total:.1f}s in the stages ({stages}){where}"
    rest = command_seconds - total
    startup = "" if timed else "start, imports, "
    return (
        f"{command_seconds:.1f}s {timed or 'the whole command'}: {total:.1f}s in the stages ({stages}), "
        f"{rest:.1f}s the rest ({startup}{'Ray' if runner['name'] == 'ray' else 'the tokenizer'}, "
        f"report){where}"
    )


def _files_line(result: JobResult) -> str:
    """Data files and their bytes with every companion (pack indexes, .idx, masks) and dataset file."""
    fmt = result.output_format.get("name", "parquet")
    size = total_bytes(result.files, result.output_format.get("files", []))
    n = len(result.files)
    return f"{n} {fmt} file{'s' if n != 1 else ''}, {size / 2**20:.1f} MiB"


def format_rebuild(result: RebuildResult, command_seconds: float | None = None) -> str:
    job = result.job
    waited = result.waited_s
    lines = [
        format_summary(job, None if command_seconds is None else command_seconds - waited),
        f"version  {result.version} is now LATEST; shards: {job.shards_reused:,} reused from the cache, "
        f"{job.shards_tokenized:,} tokenized (new or changed)",
    ]
    if waited:
        lines.append(f"lease    waited {waited:.0f} s for another rebuild of this root to finish")
    if result.removed_versions or result.swept_versions or result.cache_entries_removed:
        old = ", ".join(f"v={n:06d}" for n in result.removed_versions) or "none"
        swept = ", ".join(f"v={n:06d}" for n in result.swept_versions) or "none"
        lines.append(
            f"cleanup  old versions removed: {old}; incomplete versions removed: {swept}; "
            f"{result.cache_entries_removed} unused cache files removed"
        )
    return "\n".join(lines)
