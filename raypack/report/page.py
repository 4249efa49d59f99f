"""The report as one self-contained HTML file: inline CSS, figures as inline SVG, no script and
nothing fetched, so it opens from object storage, a laptop or a CI artifact alike. Every string that
comes from the data (paths, document ids, rejected records) is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from raypack._version import __version__
from raypack.corpus.readers.records import CUT_KINDS
from raypack.mixture import SOURCE_HEADER, source_cells
from raypack.report import plots
from raypack.report.model import Report, Run
from raypack.text.chat import chat_rows

__all__ = ["render"]

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       margin: 0; background: #fafafa; }
main { width: 940px; margin: 0 auto; padding: 16px 0 40px; }
h1 { font-size: 22px; margin: 8px 0 12px; word-break: break-all; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.facts th { width: 110px; background: #f3f3f3; }
table.metrics { font-size: 12.5px; }
table.metrics th, table.metrics td { padding: 3px 6px; }
figure { margin: 10px 0; background: #fff; border: 1px solid #e4e4e4; width: 900px; }
figure svg { display: block; }
figcaption { padding: 4px 8px 6px; color: #555; font-size: 13px; }
.note { background: #fff8e1; border: 1px solid #f0e0a0; padding: 6px 10px; margin: 8px 0; }
code, td.raw { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
td.raw { max-width: 420px; overflow-wrap: anywhere; white-space: pre-wrap; }
footer { color: #777; font-size: 12px; margin-top: 30px; }
"""


def render(report: Report) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(report.title)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>{_e(report.title)}</h1>",
        _facts(report.facts),
        *(f'<p class="note">{_e(n)}</p>' for n in report.notes),
        *(["<h2>Mixture</h2>", _sources_table(report.sources)] if report.sources else []),
        *(["<h2>Chat data</h2>", _facts(chat_rows(report.chat))] if report.chat else []),
        "<h2>Packing</h2>",
        _metrics_table(report.runs),
        _figure(
            plots.length_figure(report),
            "Document length",
            "Documents by length, before any cut (log-log). Dashed: seq_len; " + _cut_rule(report)[0],
        ),
        *(
            _figure(
                svg,
                f"Pack fill at seq_len {seq_len}",
                "Packs by real tokens over capacity, in whole percent (log count axis); the rest of a pack "
                "is padding.",
            )
            for seq_len, svg in plots.fill_figures(report)
        ),
        _figure(
            plots.truncation_figure(report),
            "Truncations per document",
            "A document cut into k pieces counts k - 1 truncations (one more if shortened or dropped). "
            + _cut_rule(report)[1],
        ),
    ]
    if report.stage_seconds:
        parts += [
            "<h2>Time</h2>",
            _figure(plots.stage_figure(report.stage_seconds), "Time per stage", "Wall-clock seconds."),
        ]
    if not report.dry_run:
        parts += ["<h2>Rejects</h2>", _rejects(report)]
    parts += [
        f"<footer>raypack {_e(__version__)}. Definitions: docs/algorithms.md and raypack/metrics.py; "
        "padding ratio = 1 - efficiency (Liu et al.); r_cat = input documents / packs (Liu et al.'s "
        "concatenation ratio); docs per pack = items / packs (Krell et al.'s packing factor)."
        "</footer>",
        "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _cut_rule(report: Report) -> tuple[str, str]:
    """How the job's packer cuts documents, for the length and truncation figures' captions."""
    algorithm = report.runs[0].metrics.algorithm if report.runs and not report.dry_run else ""
    if report.dry_run:  # several packers side by side
        return (
            "a document longer than it is cut into seq_len-sized chunks and a remainder (or "
            "truncated/dropped, as pack.overflow says) by every packer but decompose and concat.",
            "The histogram and item packers cut only documents longer than seq_len (Ding et al., "
            "2024); decompose cuts every length that is not a power of two, concat at every pack "
            "boundary.",
        )
    if algorithm == "decompose":
        return (
            "decompose cuts every document into its binary form's chunks, largest first, none over "
            "seq_len; the last length mod pack.min_seq_len tokens are in no chunk.",
            "decompose cuts every document whose length is not a power of two (Pouransari et al., 2024).",
        )
    if algorithm == "concat":
        return (
            "concat cuts the stream of all documents at every seq_len.",
            "concat cuts a document wherever a pack boundary falls in it.",
        )
    return (
        "a document longer than it is cut into seq_len-sized chunks and a remainder (or "
        "truncated/dropped, as pack.overflow says).",
        "This packer cuts only documents longer than seq_len (Ding et al., 2024).",
    )


def _sources_table(sources: Sequence[dict[str, Any]]) -> str:
    """A row a source: what the config asked, tokens in and kept, target, tokens out, shares,
    repetition, documents left out, truncated copies and the partial copy (SOURCE_HEADER's columns)."""
    head = "".join(f'<th class="{"num" if i >= 2 else ""}">{_e(h)}</th>' for i, h in enumerate(SOURCE_HEADER))
    rows = []
    for r in sources:
        cells = source_cells(r)
        rows.append(
            "<tr>"
            + "".join(f'<td class="{"num" if i >= 2 else ""}">{_e(c)}</td>' for i, c in enumerate(cells))
            + "</tr>"
        )
    caption = (
        '<p class="note">Tokens in: the documents\' tokens as tokenized. Targets, tokens out and shares '
        "count what pack.overflow keeps (at most seq_len a document under truncate, none of a too-long one "
        "under drop). A source's tokens out are within half a document, or half of seq_len under split, "
        "of its target: under split the document the cut falls in may give a partial copy, its first "
        "chunks of seq_len, each alone in its pack (raypack.mixture). Repeat: tokens out / tokens kept. "
        "Truncated: copies cut by overflow (under drop: documents dropped, each counted once) or partial."
        "</p>"
    )
    warnings = "".join(
        f'<p class="note">! {_e(r["share_warning"])}</p>' for r in sources if r.get("share_warning")
    )
    return f'<table class="metrics"><tr>{head}</tr>{"".join(rows)}</table>{warnings}{caption}'


def _facts(facts: Sequence[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


_COLUMNS = (
    ("algorithm", False),
    ("seq_len", True),
    ("packs", True),
    ("lower bound", True),
    ("packs / LB", True),
    ("efficiency", True),
    ("padding ratio", True),
    ("truncation ratio", True),
    ("r_cat (Liu)", True),
    ("docs per pack", True),
    ("most docs in a pack", True),
    ("tokens dropped", True),
)


def _metrics_table(runs: Sequence[Run]) -> str:
    timed = any(r.seconds is not None for r in runs)
    columns = [*_COLUMNS, *([("seconds", True)] if timed else [])]
    head = "".join(f'<th class="{"num" if num else ""}">{_e(name)}</th>' for name, num in columns)
    rows = []
    for r in runs:
        m = r.metrics
        cells = [
            r.name,
            f"{m.seq_len:,}",
            f"{m.packs:,}",
            # Packs of several lengths: a bound in packs of seq_len says nothing of them.
            "—" if m.lengths_vary else f"{m.lower_bound:,}",
            "—" if m.lengths_vary else f"{m.packs_over_lower_bound:.5f}",
            f"{100 * m.efficiency:.4f}%",
            f"{m.padding_ratio:.5f}",
            f"{m.truncation_ratio:.4f}",
            f"{m.concatenation_ratio:.2f}",
            f"{m.packing_factor:.2f}",
            f"{m.max_depth:,}",
            f"{m.tokens_dropped:,}",
            *([f"{r.seconds:.3f}" if r.seconds is not None else ""] if timed else []),
        ]
        tds = "".join(
            f'<td class="{"num" if num else ""}">{_e(c)}</td>'
            for c, (_, num) in zip(cells, columns, strict=True)
        )
        rows.append(f"<tr>{tds}</tr>")
    return f'<table class="metrics"><tr>{head}</tr>{"".join(rows)}</table>'


def _figure(svg: str | None, alt: str, caption: str) -> str:
    """A figure and its caption; `alt` names it where the drawing is not seen (its aria-label is the
    figure's title)."""
    if svg is None:
        return ""
    return f'<figure aria-label="{_e(alt)}">{svg}<figcaption>{_e(caption)}</figcaption></figure>'


def _rejects(report: Report) -> str:
    total = report.documents + report.rejects
    cut = sum(n for kind, n in report.rejects_by_reason.items() if kind.startswith(CUT_KINDS))
    if not report.rejects and not cut:
        return f"<p>No rejects: all {report.documents:,} input records became documents.</p>"
    share = 100 * report.rejects / total if total else 0.0
    said = (
        f"<p>{report.rejects:,} of {total:,} input records ({share:.3f}%) were rejected; each is in "
        "<code>rejects/</code> with its source, row, reason and first characters.</p>"
        if report.rejects
        else f"<p>No record was rejected: all {report.documents:,} input records became documents.</p>"
    )
    parts = [
        said,
        *(
            [
                f"<p>{cut:,} documents were packed in part or not at all (pack.overflow, decompose's "
                "min_seq_len): each is in the index and has a reject in <code>rejects/</code> that "
                "stands for no record (the overflow and decompose rows below).</p>"
            ]
            if cut
            else []
        ),
        *(
            [
                f"<p><strong>{report.lost_files:,} input "
                f"{'files were' if report.lost_files != 1 else 'file was'} lost</strong> whole or in part "
                "(unreadable, or no readable text column); their records are counted above, and "
                "<code>rejects/</code> names each file.</p>"
            ]
            if report.lost_files
            else []
        ),
        '<table><tr><th>reason</th><th class="num">rejects</th></tr>',
        *(
            f'<tr><td>{_e(k)}</td><td class="num">{v:,}</td></tr>'
            for k, v in sorted(report.rejects_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
        ),
        "</table>",
    ]
    if report.reject_examples:
        parts.append(
            f"<p>The first {len(report.reject_examples)}:</p>"
            '<table><tr><th>source</th><th class="num">row</th><th>reason</th><th>record</th></tr>'
        )
        for ex in report.reject_examples:
            row = "whole file" if int(ex.get("row", -1)) < 0 else f"{int(ex['row']):,}"
            if ex.get("lost_file"):
                row += f" (lost: {int(ex.get('records', 1)):,} records)"
            parts.append(
                f"<tr><td>{_e(ex.get('source', ''))}</td><td class='num'>{row}</td>"
                f"<td>{_e(ex.get('reason', ''))}</td><td class='raw'>{_e(ex.get('raw', ''))}</td></tr>"
            )
        parts.append("</table>")
    return "".join(parts)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
