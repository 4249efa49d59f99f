"""The HTML report: its numbers, its escaping, and the page as a real browser shows it."""

from __future__ import annotations

import html
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raypack.cli import main
from raypack.dryrun import run_sweep, sample_lengths
from raypack.metrics import FILL_BINS, LENGTH_BINS_PER_OCTAVE, fill_percent_counts, length_bins
from raypack.report import REPORT, Report, from_dry_run, plots, render
from raypack.report.plots import FIGURE_PX
from raypack.text.account import backend_line

# A figure of the page: its name, then its inline SVG (width, height).
_FIGURE = re.compile(r'<figure aria-label="([^"]*)">(<svg [^>]*width="(\d+)" height="(\d+)".*?</svg>)')


def dry_run_report(n: int = 20_000) -> Report:
    lengths = sample_lengths(n, seed=1)
    runs = run_sweep(lengths, [1024, 4096], ["bfd", "greedy"])
    return from_dry_run(lengths, "sample", runs, {})


@given(st.integers(min_value=1, max_value=2**40))
def test_a_length_lies_inside_its_bin(length: int) -> None:
    (b,) = length_bins(np.array([length]))
    assert 2 ** (b / LENGTH_BINS_PER_OCTAVE) <= length * (1 + 1e-12)
    assert length < 2 ** ((b + 1) / LENGTH_BINS_PER_OCTAVE)


def test_fill_percent_counts_whole_percents_and_full_packs_apart() -> None:
    fill = np.array([2048, 2047, 1024, 1, 100])
    capacity = np.array([2048, 2048, 2048, 2048, 100])
    counts = fill_percent_counts(fill, capacity)
    assert len(counts) == FILL_BINS and counts.sum() == 5
    assert counts[100] == 2 and counts[99] == 1 and counts[50] == 1 and counts[0] == 1


def test_dry_run_page_has_every_run_and_figure_and_nothing_external() -> None:
    report = dry_run_report()
    page = render(report)
    for r in report.runs:
        m = r.metrics
        cells = [f'<td class="">{m.algorithm}</td>', f'<td class="num">{m.seq_len:,}</td>']
        assert "".join([*cells, f'<td class="num">{m.packs:,}</td>']) in page
        assert f"{100 * m.efficiency:.4f}%" in page
    # Lengths, one fill figure per seq_len, truncations; no stage times or rejects in a dry run.
    assert [alt for alt, *_ in _FIGURE.findall(page)] == [
        "Document length",
        "Pack fill at seq_len 1024",
        "Pack fill at seq_len 4096",
        "Truncations per document",
    ]
    for _, svg, width, height in _FIGURE.findall(page):
        assert (int(width), int(height)) == FIGURE_PX and svg.count("<path") >= 3
    assert "<script" not in page and not re.search(r"(src|href)=\"(https?:|//)", page)
    assert render(report) == page  # deterministic, figures included


def test_the_length_figure_puts_each_count_at_its_height_and_each_length_at_its_place() -> None:
    """Log-log: counts 1, 10, 100 a decade apart, equally spaced; lengths 1, 2, 4 (bins 0, 8, 16 of
    1/8 octave) an octave apart, equally spaced; an empty bin on the x axis; seq_len's line at its
    length."""
    svg = plots.draw_length({0: 1, 8: 10, 16: 100}, [4])
    fill = re.search(r'<path d="M([\d.]+),([\d.]+)((?:V[\d.]+H[\d.]+)+)V[\d.]+Z"', svg)
    assert fill is not None
    base = float(fill.group(2))
    steps = [(float(v), float(h)) for v, h in re.findall(r"V([\d.]+)H([\d.]+)", fill.group(3))]
    assert len(steps) == 17  # every bin from the first to the last
    heights = [steps[b][0] for b in (0, 8, 16)]
    assert heights[0] < base and all(steps[b][0] == base for b in range(1, 8))  # empty: on the axis
    assert abs((heights[0] - heights[1]) - (heights[1] - heights[2])) <= 0.2 and heights[2] < heights[1]
    left = float(fill.group(1))
    xs = [left, steps[7][1], steps[15][1]]  # the left edges of bins 0, 8 and 16: lengths 1, 2, 4
    assert abs((xs[1] - xs[0]) - (xs[2] - xs[1])) <= 0.2 and xs[1] > xs[0]
    line = re.search(
        r'<path d="M([\d.]+),[\d.]+V[\d.]+" stroke="[^"]+" stroke-width="1.5" stroke-dasharray', svg
    )
    assert line is not None and abs(float(line.group(1)) - xs[2]) <= 0.1
    assert "seq_len 4: ~90.1% longer" in svg  # 100 of 111 documents in bins from 4 on


@pytest.mark.parametrize("seq_lens", [[4], [2048], [512, 1024, 2048, 4096, 8192, 16384]])
def test_seq_len_labels_cross_no_line_and_no_other_label(seq_lens: list[int]) -> None:
    """Each seq_len's line is named in the legend, inside the figure: a dry run's lines an octave
    apart had their notes beside them run across the next lines and over each other; a seq_len past
    every document had its note clipped at the axes' edge."""
    svg = plots.draw_length({0: 1, 8: 10, 16: 100, 80: 5, 110: 2}, seq_lens)
    lines = [float(x) for x in re.findall(r'<path d="M([\d.]+),[\d.]+V[\d.]+"[^>]*stroke-dasharray', svg)]
    labels = [
        (float(x), float(y), size, text)
        for x, y, size, text in re.findall(
            r'<text x="([\d.]+)" y="([\d.]+)" font-size="(\d+)"[^>]*>(seq_len [^<]*)</text>', svg
        )
    ]
    assert len(lines) == len(labels) == len(seq_lens)
    legend = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="#fff"', svg)
    assert legend is not None  # a box drawn over the lines, on white
    lx, ly, lw, lh = map(float, legend.groups())
    boxes = [(x, y - 6, x + 0.62 * int(size) * len(text), y + 6) for x, y, size, text in labels]
    for x0, y0, x1, y1 in boxes:
        assert lx <= x0 and x1 <= lx + lw <= FIGURE_PX[0] and ly <= y0 and y1 <= ly + lh
    for a, b in itertools.combinations(boxes, 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)


def test_every_string_from_the_data_is_escaped() -> None:
    hostile = '<script>alert("x")</script>'
    report = Report(
        title=f"raypack: out/{hostile}",
        facts=(("input", hostile),),
        length_bins={80: 3},
        runs=dry_run_report(2_000).runs[:1],
        documents=3,
        rejects=1,
        rejects_by_reason={hostile: 1},
        reject_examples=({"source": hostile, "row": 4, "reason": hostile, "raw": hostile},),
        notes=(hostile,),
    )
    page = render(report)
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") == 8  # title twice, 6 places once


def test_plan_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--sample",
            "5000",
            "--seq-len",
            "2048",
            "--algorithm",
            "bfd,spfhp",
            "--report",
            str(tmp_path),
        ]
    )
    assert code == 0
    page = (tmp_path / REPORT).read_text()
    assert "built-in sample: 5,000 lognormal" in page and len(_FIGURE.findall(page)) == 3
    assert f"report: {tmp_path / REPORT}" in capsys.readouterr().err


def test_report_of_a_directory_without_a_dataset_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"raypack: error: {tmp_path}: no manifest.json, so no complete raypack dataset to report on"
    ]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(page: Path, out: Path, width: int, height: int) -> np.ndarray:
    """The page as headless Chromium draws it (1 CSS px = 1 pixel, sRGB), as an RGB array."""
    from PIL import Image

    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium for the report test: make test installs it (apt-get)")
        pytest.skip("no chromium: `apt-get install chromium` to run the browser test")
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",  # this machine has no network: no update or sync calls
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={out / 'profile'}",
        "--force-device-scale-factor=1",
        "--force-color-profile=srgb",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--screenshot={out / 'shot.png'}",
        page.as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert (out / "shot.png").exists(), done.stderr[-2000:]
    return np.asarray(Image.open(out / "shot.png").convert("RGB"))


def find(screen: np.ndarray, image: np.ndarray) -> tuple[int, int] | None:
    """Top-left corner where `image` appears in `screen`, or None: pixel for pixel but for a few
    off by some shades. Chromium rasterizes a page in tiles, and the antialiased edges of a figure's
    paths come out a little apart at another offset in the page: 9 pixels of 306,000 by 2 of 255 in
    one figure, 875 by up to 50 in another (lines and dots). A figure scaled, shifted or clipped by
    even a few rows differs in thousands."""
    h, w = image.shape[:2]
    # Anchor on the rarest colours of the title's rows (text, away from the data's paths), then
    # compare whole images at each candidate corner.
    band = image[: max(1, h // 10)]
    colours, counts = np.unique(band.reshape(-1, 3), axis=0, return_counts=True)
    for anchor in colours[np.argsort(counts, kind="stable")[:5]]:
        ay, ax = np.argwhere((band == anchor).all(axis=2))[0]
        for y, x in np.argwhere((screen == anchor).all(axis=2)):
            top, left = y - ay, x - ax
            if top < 0 or left < 0 or top + h > screen.shape[0] or left + w > screen.shape[1]:
                continue
            diff = np.abs(screen[top : top + h, left : left + w].astype(np.int16) - image).max(axis=2)
            if (diff > 2).sum() <= 0.01 * h * w:
                return int(top), int(left)
    return None


def test_a_real_browser_shows_every_plot(tmp_path: Path) -> None:
    """Each figure must be drawn where the page puts it, as the browser draws its SVG alone (at the
    top-left of a page with the report's style, so the same fonts): a figure the CSS scales, clips or
    hides, or one the browser cannot draw (then blank), fails."""
    report = dry_run_report()
    text = render(report)
    page = tmp_path / REPORT
    page.write_text(text)
    head = text[: text.index("<main>")]
    alone = []
    for i, (_, svg, width, height) in enumerate(_FIGURE.findall(text)):
        path, out = tmp_path / f"figure-{i}.html", tmp_path / f"figure-{i}"
        path.write_text(f"{head}{svg}</body></html>")
        out.mkdir()
        shot = screenshot(path, out, 1000, 600)[: int(height), : int(width)]
        coloured = (shot.max(axis=2).astype(int) - shot.min(axis=2)) > 60  # the data's colours
        assert coloured.sum() > 300 and (shot < 80).all(axis=2).sum() > 300, f"figure {i} drawn blank"
        alone.append(shot)
    screen = screenshot(page, tmp_path, 1000, 3000)
    corners = [find(screen, img) for img in alone]
    assert all(c is not None for c in corners), corners
    tops = [c[0] for c in corners if c is not None]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)  # in page order, one under another
    # The metrics table is drawn above the first figure: dark text pixels between the title and it.
    assert (screen[: tops[0]] < 80).all(axis=2).sum() > 2000


def test_a_jobs_report_is_the_one_made_from_its_dataset(tmp_path: Path, tokenizer_path: Path) -> None:
    """The report a job writes after its commit is byte for byte the one `raypack report` makes from
    the dataset alone (manifest.json and metrics.json): figures included, nothing from the run's
    memory. It says what encoded the documents and what checked them, as the summary does."""
    from raypack.config import load_config
    from raypack.pipeline.job import run_job
    from tests.conftest import job_config, make_corpus

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=30, seed=3)
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path)))
    run_job(cfg, log=lambda _: None)
    page = (tmp_path / "out" / REPORT).read_text()
    assert next(name for name, *_ in _FIGURE.findall(page)) == "Document length"
    backend = json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]["backend"]
    assert f"<tr><th>encoded by</th><td>{html.escape(backend_line(backend))}</td></tr>" in page
    assert main(["report", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / REPORT).read_text() == page
