"""The report's figures, drawn with matplotlib's Agg renderer into PNG bytes (no display, no pyplot
state: each figure is its own object, safe in a job's driver). One function per figure; each returns
None when it has nothing to show.

Figures are 900 × 340 px at 1× and the page shows them at that size: a browser then draws every pixel
as encoded (tests/test_report.py finds each PNG pixel for pixel in a real browser's screenshot).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from raypack.metrics import LENGTH_BINS_PER_OCTAVE
from raypack.report.model import Report

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "FIGURE_PX",
    "draw_length",
    "fill_figures",
    "length_figure",
    "stage_figure",
    "truncation_figure",
    "warm",
]

DPI = 100
FIGURE_PX = (900, 340)
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def length_figure(report: Report) -> bytes | None:
    """Documents by length, log-log, with every seq_len of the report marked."""
    if not report.length_bins:
        return None
    return draw_length(report.length_bins, [r.metrics.seq_len for r in report.runs])


def draw_length(length_bins: dict[int, int], seq_lens: Iterable[int]) -> bytes:
    """length_figure's PNG from its inputs, kept for the process (the last two): a job draws it
    while assign+write runs (its inputs are known from the histogram on), so the report after the
    commit finds it drawn (0.2 s of the ~0.6 s it took there, 500 MB job on 2 cores)."""
    return _length_png(tuple(sorted(length_bins.items())), tuple(sorted(set(seq_lens))))


@functools.lru_cache(maxsize=2)
def _length_png(length_bins: tuple[tuple[int, int], ...], seq_lens: tuple[int, ...]) -> bytes:
    bins = np.array([b for b, _ in length_bins], dtype=np.int64)
    counts = np.array([n for _, n in length_bins], dtype=np.int64)
    # Every bin from the first to the last, empty ones included, so the outline does not bridge gaps.
    full = np.zeros(int(bins[-1] - bins[0]) + 1, dtype=np.int64)
    full[bins - bins[0]] = counts
    edges = 2.0 ** (np.arange(bins[0], bins[-1] + 2) / LENGTH_BINS_PER_OCTAVE)
    fig, ax = _figure()
    ax.stairs(full, edges, fill=True, color=_COLORS[0], alpha=0.85, label="documents")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.7)
    ax.set_xlabel("document length (tokens, 1/8-octave bins)")
    ax.set_ylabel("documents")
    total = int(counts.sum())
    for i, seq_len in enumerate(seq_lens):
        over = int(counts[(2.0 ** (bins / LENGTH_BINS_PER_OCTAVE)) >= seq_len].sum())
        ax.axvline(seq_len, color=_COLORS[3 + i % 5], linestyle="--", linewidth=1.5)
        share = f"{100 * over / total:.1f}%" if total else "0%"
        ax.text(
            seq_len,
            0.97 - 0.09 * i,
            f" seq_len {seq_len}: ~{share} longer",
            transform=ax.get_xaxis_transform(),
            va="top",
            fontsize=9,
            color=_COLORS[3 + i % 5],
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1},
        )
    ax.set_title("Document length")
    return _png(fig)


def fill_figures(report: Report) -> list[tuple[int, bytes]]:
    """Packs by fill (whole percent of capacity), log count axis: one figure per seq_len, a line per
    algorithm when a dry run compared several."""
    out = []
    for seq_len in sorted({r.metrics.seq_len for r in report.runs}):
        runs = [r for r in report.runs if r.metrics.seq_len == seq_len and any(r.fill_percent)]
        if not runs:
            continue
        fig, ax = _figure()
        percent = np.arange(len(runs[0].fill_percent))
        lowest = min(int(np.flatnonzero(r.fill_percent)[0]) for r in runs)
        if len(runs) == 1:
            # One filled outline, not 101 bars: a bar is an artist of its own with its transforms
            # (0.25 s of the report's drawing went to them).
            edges = np.r_[percent - 0.5, percent[-1] + 0.5]
            ax.stairs(runs[0].fill_percent, edges, fill=True, color=_COLORS[0], label=runs[0].label)
        else:
            for i, r in enumerate(runs):
                ax.stairs(
                    r.fill_percent, np.r_[percent - 0.5, percent[-1] + 0.5], color=_color(i), label=r.label
                )
            ax.legend(fontsize=8, ncols=2, loc="upper left")
        ax.set_yscale("log")
        ax.set_ylim(bottom=0.7)
        ax.set_xlim(max(-1, lowest - 2), 101)
        ax.set_xlabel("pack fill (% of capacity; 100 = full)")
        ax.set_ylabel("packs")
        ax.set_title(f"Pack fill, seq_len {seq_len}")
        out.append((seq_len, _png(fig)))
    return out


def truncation_figure(report: Report) -> bytes | None:
    """Truncations per document by power-of-two length band (Ding et al.'s figure 1), per run."""
    # Packers compared on one histogram cut the same documents: the written run stands for them.
    runs = [r for r in report.runs if r.metrics.truncation_bands and not r.compared]
    if not runs:
        return None
    fig, ax = _figure()
    if len(runs) == 1:
        bands = runs[0].metrics.truncation_bands
        x = np.arange(len(bands))
        ax.bar(x, [b.truncations_per_doc for b in bands], color=_COLORS[0], width=0.8)
        ax.set_xticks(x, [_band(b.lo) for b in bands], fontsize=8, rotation=0)
        ax.set_xlabel("document length band (tokens)")
    else:
        for i, r in enumerate(runs):
            bands = r.metrics.truncation_bands
            ax.plot(
                [b.lo for b in bands],
                [b.truncations_per_doc for b in bands],
                marker="o",
                markersize=3,
                color=_color(i),
                label=r.label,
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document length band (tokens, lower edge)")
        ax.legend(fontsize=8, ncols=2, loc="upper left")
    ax.set_ylabel("truncations per document")
    ax.set_title("Truncations per document by length")
    return _png(fig)


def stage_figure(stage_seconds: dict[str, float]) -> bytes | None:
    if not stage_seconds:
        return None
    names = list(stage_seconds)
    seconds = [stage_seconds[n] for n in names]
    # ~7 px a character of a stage's name at the tick labels' 10 pt, beside the tick.
    fig, ax = _figure(
        height=max(1.6, 0.42 * len(names) + 0.8), left_px=max(78, 7 * max(map(len, names)) + 24)
    )
    y = np.arange(len(names))[::-1]
    ax.barh(y, seconds, color=_COLORS[0])
    ax.set_yticks(y, names)
    for yi, s in zip(y, seconds, strict=True):
        ax.text(s, yi, f" {s:.1f} s", va="center", fontsize=9)
    ax.set_xlim(0, max(seconds) * 1.15 or 1)
    ax.set_xlabel("seconds")
    ax.set_title(f"Time per stage ({sum(seconds):.1f} s in all)")
    return _png(fig)


def warm() -> None:
    """Import matplotlib and draw one small figure of the kinds the report draws (log axes, a filled
    outline, boxed text): what the first figure of a process pays, 0.5 s of imports and 0.4 s of
    font and renderer setup on 2 cores. The job calls it in a thread while its stages run, so the
    report drawn after the commit takes ~0.5 s instead of ~1.6 s (44 MB chat job)."""
    fig, ax = _figure()
    ax.stairs(np.array([1, 2, 3]), np.array([1.0, 2.0, 4.0, 8.0]), fill=True)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("warm")
    ax.text(2.0, 2.0, "warm", bbox={"facecolor": "white", "edgecolor": "none"})
    _png(fig)


# The axes' margins in pixels, fixed: matplotlib's constrained layout measured every tick label to
# find them, 0.24 s of each figure's ~0.5 s (0.7 s of a job's report, after its commit).
_MARGINS_PX = {"left": 78, "right": 18, "bottom": 46, "top": 30}


def _figure(height: float | None = None, left_px: int | None = None) -> tuple[Figure, Axes]:
    """A figure of the report's width and the axes in it; `left_px`: a left margin wider than the
    default (long tick labels on the y axis)."""
    from matplotlib.figure import Figure

    width, h = FIGURE_PX[0] / DPI, (height or FIGURE_PX[1] / DPI)
    fig = Figure(figsize=(width, h), dpi=DPI)
    m = _MARGINS_PX | ({"left": left_px} if left_px else {})
    fig.subplots_adjust(
        left=m["left"] / (width * DPI),
        right=1 - m["right"] / (width * DPI),
        bottom=m["bottom"] / (h * DPI),
        top=1 - m["top"] / (h * DPI),
    )
    ax = fig.add_subplot()
    ax.grid(True, which="major", alpha=0.3)
    ax.set_axisbelow(True)
    return fig, ax


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # No Software tag: the same report gives the same bytes whatever matplotlib build wrote it.
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _band(lo: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if lo >= size:
            return f"{lo // size}{unit}"
    return str(lo)
