"""The report's figures as inline SVG, written here and drawn by the browser that opens the page. One
function per figure; each returns None when it has nothing to show.

Not matplotlib: importing it and drawing four figures costs 1.3-1.9 s of CPU a job, and a job on 2
cores is CPU-bound, so the command would take that much longer (~11% of a 130 MB job). These take a
few milliseconds, and the page's text stays text (selectable, sharp at any zoom).

Figures are 900 px wide, 340 px high (the stage figure: by its rows), in CSS pixels; coordinates are
written with one decimal, so the same report gives the same bytes.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from raypack.metrics import LENGTH_BINS_PER_OCTAVE
from raypack.report.model import Report

__all__ = [
    "FIGURE_PX",
    "Scale",
    "draw_length",
    "fill_figures",
    "length_figure",
    "stage_figure",
    "truncation_figure",
]

FIGURE_PX = (900, 340)
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
# The axes' margins in pixels: room for the title above, tick labels and the axis label below and left.
_MARGINS = {"left": 78, "right": 18, "bottom": 46, "top": 30}
_CHAR_PX = 7.0  # a character of the 12 px labels, wide side (the legend's columns, the stage names)


def length_figure(report: Report) -> str | None:
    """Documents by length, log-log, with every seq_len of the report marked."""
    if not report.length_bins:
        return None
    return draw_length(report.length_bins, [r.metrics.seq_len for r in report.runs])


def draw_length(length_bins: dict[int, int], seq_lens: Iterable[int]) -> str:
    """length_figure's SVG from its inputs: documents by 1/8-octave bin of length."""
    bins = np.array(sorted(length_bins), dtype=np.int64)
    counts = np.array([length_bins[int(b)] for b in bins], dtype=np.int64)
    # Every bin from the first to the last, empty ones included, so the outline does not bridge gaps.
    full = np.zeros(int(bins[-1] - bins[0]) + 1, dtype=np.int64)
    full[bins - bins[0]] = counts
    edges = 2.0 ** (np.arange(bins[0], bins[-1] + 2) / LENGTH_BINS_PER_OCTAVE)
    lines = sorted(set(seq_lens))
    # The x range holds every bin and every seq_len, with a little room either side.
    lo = min(float(edges[0]), *lines) / 1.15 if lines else float(edges[0]) / 1.15
    hi = max(float(edges[-1]), *lines) * 1.15 if lines else float(edges[-1]) * 1.15
    plot = _Plot(
        Scale(lo, hi, log=2, label=_band),
        Scale(0.7, _log_top(int(full.max())), log=10, label=_count),
        "Document length",
    )
    plot.stairs(full, edges, _COLORS[0], fill=True, opacity=0.85)
    total = int(counts.sum())
    for i, seq_len in enumerate(lines):
        over = int(counts[(2.0 ** (bins / LENGTH_BINS_PER_OCTAVE)) >= seq_len].sum())
        share = f"~{100 * over / total:.1f}% longer" if over else "none longer"
        color = _COLORS[3 + i % 5]
        # Named in the legend, not beside the line: a dry run's lines lie an octave apart, closer
        # than their notes are long, and notes beside them ran over each other and the lines.
        plot.vline(seq_len, color, label=f"seq_len {seq_len:,}: {share}")
    return plot.svg("document length (tokens, 1/8-octave bins)", "documents")


def fill_figures(report: Report) -> list[tuple[int, str]]:
    """Packs by fill (whole percent of capacity), log count axis: one figure per seq_len, a line per
    algorithm when a dry run compared several."""
    out = []
    for seq_len in sorted({r.metrics.seq_len for r in report.runs}):
        runs = [r for r in report.runs if r.metrics.seq_len == seq_len and any(r.fill_percent)]
        if not runs:
            continue
        percent = np.arange(len(runs[0].fill_percent))
        edges = np.r_[percent - 0.5, percent[-1] + 0.5]
        lowest = min(int(np.flatnonzero(r.fill_percent)[0]) for r in runs)
        most = max(max(r.fill_percent) for r in runs)
        plot = _Plot(
            Scale(max(-1, lowest - 2), 101),
            Scale(0.7, _log_top(most), log=10, label=_count),
            f"Pack fill, seq_len {seq_len:,}",
        )
        if len(runs) == 1:
            plot.stairs(np.array(runs[0].fill_percent), edges, _COLORS[0], fill=True)
        else:
            for i, r in enumerate(runs):
                plot.stairs(np.array(r.fill_percent), edges, _color(i), label=r.label, dash=_dash(i))
        out.append((seq_len, plot.svg("pack fill (% of capacity; 100 = full)", "packs")))
    return out


def truncation_figure(report: Report) -> str | None:
    """Truncations per document by power-of-two length band (Ding et al.'s figure 1), per run."""
    # Packers compared on one histogram cut the same documents: the written run stands for them.
    runs = [r for r in report.runs if r.metrics.truncation_bands and not r.compared]
    if not runs:
        return None
    title = "Truncations per document by length"
    top = max(b.truncations_per_doc for r in runs for b in r.metrics.truncation_bands)
    y = Scale(0, top * 1.1 or 1)
    if len(runs) == 1:
        bands = runs[0].metrics.truncation_bands
        names = [_band(b.lo) for b in bands]
        plot = _Plot(_categories(names), y, title)
        plot.bars([b.truncations_per_doc for b in bands], _COLORS[0])
        if not top:
            plot.centered("no document was cut")
        return plot.svg("document length band (tokens)", "truncations per document")
    los = [b.lo for r in runs for b in r.metrics.truncation_bands]
    plot = _Plot(Scale(min(los) / 1.3, max(los) * 1.3, log=2, label=_band), y, title)
    for i, r in enumerate(runs):
        bands = r.metrics.truncation_bands
        plot.line([b.lo for b in bands], [b.truncations_per_doc for b in bands], _color(i), r.label, _dash(i))
    return plot.svg("document length band (tokens, lower edge)", "truncations per document")


def stage_figure(stage_seconds: dict[str, float]) -> str | None:
    """Wall-clock seconds per stage, a bar each, in the order the stages ran."""
    if not stage_seconds:
        return None
    names = list(stage_seconds)
    seconds = [stage_seconds[n] for n in names]
    plot = _Plot(
        Scale(0, max(seconds) * 1.15 or 1),
        Scale(
            -0.6, len(names) - 0.4, label=lambda v: names[len(names) - 1 - int(v)], ticks=range(len(names))
        ),
        f"Time per stage ({sum(seconds):.1f} s in all)",
        height=max(160, 42 * len(names) + 80),
        left=max(_MARGINS["left"], round(_CHAR_PX * max(map(len, names))) + 24),
    )
    plot.hbars(seconds[::-1], _COLORS[0], [f"{s:.1f} s" for s in seconds[::-1]])
    return plot.svg("seconds", "")


@dataclass
class Scale:
    """An axis: data values `lo`..`hi` onto pixels `p0`..`p1` (set by the plot), linear or log to
    `log`'s base; `ticks`: where its ticks go (default: decades, or powers of two, or round steps);
    `label`: a tick's text."""

    lo: float
    hi: float
    log: int | None = None
    label: Callable[[float], str] | None = None
    ticks: Iterable[float] | None = None
    p0: float = 0.0
    p1: float = 1.0

    def __call__(self, value: float) -> float:
        """The pixel of `value`, clamped to the axis (a log axis's 0 sits at its bottom)."""
        if self.log:
            v = math.log(max(value, self.lo)) if value > 0 else math.log(self.lo)
            lo, hi = math.log(self.lo), math.log(self.hi)
        else:
            v, lo, hi = float(value), self.lo, self.hi
        frac = min(1.0, max(0.0, (v - lo) / (hi - lo)))
        return self.p0 + frac * (self.p1 - self.p0)

    def tick_values(self) -> list[float]:
        if self.ticks is not None:
            return [float(t) for t in self.ticks]
        if self.log:
            first = math.ceil(math.log(self.lo, self.log) - 1e-9)
            last = math.floor(math.log(self.hi, self.log) + 1e-9)
            step = max(1, math.ceil((last - first + 1) / 12))  # at most ~12 labels side by side
            return [float(self.log**k) for k in range(first, last + 1) if (k - first) % step == 0]
        raw = (self.hi - self.lo) / 6
        magnitude = 10 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
        start = math.ceil(self.lo / step - 1e-9)
        return [k * step for k in range(start, math.floor(self.hi / step + 1e-9) + 1)]

    def text(self, value: float) -> str:
        if self.label is not None:
            return self.label(value)
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


@dataclass
class _Plot:
    """One figure: its axes, what is drawn in them (in order, clamped to them) and its texts."""

    x: Scale
    y: Scale
    title: str
    height: int = FIGURE_PX[1]
    left: int = _MARGINS["left"]
    marks: list[str] = field(default_factory=list)
    legend: list[tuple[str, str, str]] = field(default_factory=list)
    """(label, colour, dash attribute) a line."""

    def __post_init__(self) -> None:
        self.x.p0, self.x.p1 = self.left, FIGURE_PX[0] - _MARGINS["right"]
        self.y.p0, self.y.p1 = self.height - _MARGINS["bottom"], _MARGINS["top"]

    def stairs(
        self,
        values: np.ndarray,
        edges: np.ndarray,
        color: str,
        fill: bool = False,
        opacity: float = 1.0,
        label: str | None = None,
        dash: str = "",
    ) -> None:
        """A step outline: values[i] from edges[i] to edges[i + 1]; `fill`: down to the x axis."""
        xs = [_f(self.x(float(e))) for e in edges]
        ys = [_f(self.y(float(v))) for v in values]
        steps = "".join(f"V{ys[i]}H{xs[i + 1]}" for i in range(len(ys)))
        if fill:
            base = _f(self.y.p0)
            self.marks.append(
                f'<path d="M{xs[0]},{base}{steps}V{base}Z" fill="{color}" fill-opacity="{opacity}"/>'
            )
        else:
            d = f"M{xs[0]},{ys[0]}{steps}"
            self.marks.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>')
        if label is not None:
            self.legend.append((label, color, dash))

    def bars(self, heights: Sequence[float], color: str) -> None:
        """A vertical bar per category 0, 1, ..., 0.8 of a category wide."""
        base = self.y.p0
        for i, h in enumerate(heights):
            x0, x1, top = self.x(i - 0.4), self.x(i + 0.4), self.y(h)
            self.marks.append(_rect(x0, top, x1 - x0, base - top, color))

    def hbars(self, lengths: Sequence[float], color: str, notes: Sequence[str]) -> None:
        """A horizontal bar per category 0, 1, ... (bottom up), its note at its end."""
        for i, (length, note) in enumerate(zip(lengths, notes, strict=True)):
            y0, y1, end = self.y(i + 0.4), self.y(i - 0.4), self.x(length)
            self.marks.append(_rect(self.x.p0, y0, end - self.x.p0, y1 - y0, color))
            self.marks.append(_text(end + 4, (y0 + y1) / 2, note, dy="0.35em"))

    def line(self, xs: Sequence[float], ys: Sequence[float], color: str, label: str, dash: str = "") -> None:
        """A polyline with a dot at each point."""
        points = [(self.x(x), self.y(y)) for x, y in zip(xs, ys, strict=True)]
        path = "M" + "L".join(f"{_f(px)},{_f(py)}" for px, py in points)
        self.marks.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>')
        self.marks += [f'<circle cx="{_f(px)}" cy="{_f(py)}" r="3" fill="{color}"/>' for px, py in points]
        self.legend.append((label, color, dash))

    def vline(self, x: float, color: str, label: str) -> None:
        """A dashed line across the axes at data x, named in the legend."""
        px = _f(self.x(x))
        dash = ' stroke-dasharray="6,3"'
        self.marks.append(
            f'<path d="M{px},{_f(self.y.p0)}V{_f(self.y.p1)}" stroke="{color}" stroke-width="1.5"{dash}/>'
        )
        self.legend.append((label, color, dash))

    def centered(self, text: str) -> None:
        """A note in the middle of the axes (a figure with nothing to draw)."""
        y = (self.y.p0 + self.y.p1) / 2
        self.marks.append(_text((self.x.p0 + self.x.p1) / 2, y, text, anchor="middle", size=14, fill="#555"))

    def svg(self, xlabel: str, ylabel: str) -> str:
        width, height = FIGURE_PX[0], self.height
        x0, x1, y0, y1 = self.x.p0, self.x.p1, self.y.p0, self.y.p1
        grid, ticks = [], []
        for v in self.x.tick_values():
            px = _f(self.x(v))
            grid.append(f"M{px},{_f(y0)}V{_f(y1)}")
            ticks.append(f"M{px},{_f(y0)}v4")
        for v in self.y.tick_values():
            py = _f(self.y(v))
            grid.append(f"M{_f(x0)},{py}H{_f(x1)}")
            ticks.append(f"M{_f(x0)},{py}h-4")
        labels = [_text(self.x(v), y0 + 17, self.x.text(v), anchor="middle") for v in self.x.tick_values()]
        labels += [
            _text(x0 - 7, self.y(v), self.y.text(v), anchor="end", dy="0.35em") for v in self.y.tick_values()
        ]
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(self.title)}">',
            f"<title>{_e(self.title)}</title>",
            f'<rect width="{width}" height="{height}" fill="#fff"/>',
            f'<path d="{"".join(grid)}" stroke="#e3e3e3" stroke-width="1"/>',
            *self.marks,
            f'<rect x="{_f(x0)}" y="{_f(y1)}" width="{_f(x1 - x0)}" height="{_f(y0 - y1)}" fill="none" '
            'stroke="#333" stroke-width="1"/>',
            f'<path d="{"".join(ticks)}" stroke="#333" stroke-width="1"/>',
            *labels,
            _text((x0 + x1) / 2, _MARGINS["top"] - 10, self.title, anchor="middle", size=14),
            _text((x0 + x1) / 2, height - 8, xlabel, anchor="middle"),
        ]
        if ylabel:
            parts.append(
                f'<text transform="translate(16,{_f((y0 + y1) / 2)}) rotate(-90)" text-anchor="middle" '
                f'font-size="12" fill="#222">{_e(ylabel)}</text>'
            )
        parts += self._legend()
        parts.append("</svg>")
        return "".join(parts)

    def _legend(self) -> list[str]:
        """The lines' labels in the axes' top-left corner, on white: two columns, three past eight
        lines (a dry run of every packer at three lengths has 24), in 11 px type."""
        if not self.legend:
            return []
        columns = min(len(self.legend), 2 if len(self.legend) <= 8 else 3)
        width = 34 + 6.8 * max(len(label) for label, _, _ in self.legend)  # 11 px type: ~0.62 em a character
        rows = math.ceil(len(self.legend) / columns)
        left, top = self.x.p0 + 8, self.y.p1 + 8
        box = f'x="{_f(left)}" y="{_f(top)}" width="{_f(width * columns + 8)}" height="{_f(15 * rows + 8)}"'
        parts = [f'<rect {box} fill="#fff" fill-opacity="0.9" stroke="#ccc"/>']
        for i, (label, color, dash) in enumerate(self.legend):
            lx, ly = left + 8 + width * (i % columns), top + 11 + 15 * (i // columns)
            parts.append(f'<path d="M{_f(lx)},{_f(ly)}h20" stroke="{color}" stroke-width="2"{dash}/>')
            parts.append(_text(lx + 26, ly, label, dy="0.35em", size=11))
        return parts


def _text(
    x: float,
    y: float,
    text: str,
    anchor: str = "start",
    dy: str | None = None,
    size: int = 12,
    fill: str = "#222",
    halo: bool = False,
) -> str:
    attrs = f'x="{_f(x)}" y="{_f(y)}" font-size="{size}" fill="{fill}"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if dy:
        attrs += f' dy="{dy}"'
    if halo:  # a white outline drawn under the glyphs: readable over the bars, no box to measure
        attrs += ' stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke"'
    return f"<text {attrs}>{_e(text)}</text>"


def _categories(names: Sequence[str]) -> Scale:
    """An axis of categories 0, 1, ... named `names`, each a unit wide."""
    return Scale(-0.6, len(names) - 0.4, label=lambda v: names[int(v)], ticks=range(len(names)))


def _rect(x: float, y: float, w: float, h: float, color: str) -> str:
    return f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{_f(max(h, 0.0))}" fill="{color}"/>'


def _log_top(most: int) -> float:
    """A log count axis's top: the largest count and half a decade of room (the notes at the top)."""
    return max(1, most) * 10**0.6


def _f(v: float) -> str:
    return f"{v:.1f}"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _dash(i: int) -> str:
    """A line's dash attribute: solid for the first round of colours, then dashed, then dotted."""
    return ("", ' stroke-dasharray="6,3"', ' stroke-dasharray="2,2"')[(i // len(_COLORS)) % 3]


def _count(v: float) -> str:
    """A count axis's tick (decades): 1, 10, 100, 1,000, 10k, 100k, 1M, ..."""
    n = round(v)
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= max(size, 10**4):
            return f"{n // size:,}{unit}"
    return f"{n:,}"


def _band(lo: float) -> str:
    n = round(lo)
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)
