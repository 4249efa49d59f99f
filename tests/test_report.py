"""The HTML report: its numbers, its escaping, and the page as a real browser shows it."""

from __future__ import annotations

import base64
import io
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
from raypack.report import REPORT, Report, from_dry_run, render
from raypack.report.plots import FIGURE_PX

_IMG = re.compile(r'<img alt="([^"]*)" width="(\d+)" height="(\d+)" src="data:image/png;base64,([^"]+)">')


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
    assert [alt for alt, *_ in _IMG.findall(page)] == [
        "Document length",
        "Pack fill at seq_len 1024",
        "Pack fill at seq_len 4096",
        "Truncations per document",
    ]
    for _, width, height, data in _IMG.findall(page):
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and (int(width), int(height)) == FIGURE_PX
    assert "<script" not in page and not re.search(r"(src|href)=\"(https?:|//)", page)
    assert render(report) == page  # deterministic, PNG bytes included


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
    assert "built-in sample: 5,000 lognormal" in page and page.count("<img") == 3
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
    """Top-left corner where `image` appears pixel for pixel in `screen`, or None."""
    h, w = image.shape[:2]
    # Anchor on the image's rarest colour, then compare whole images at each candidate corner.
    colours, counts = np.unique(image.reshape(-1, 3), axis=0, return_counts=True)
    anchor = colours[np.argmin(counts)]
    ay, ax = np.argwhere((image == anchor).all(axis=2))[0]
    for y, x in np.argwhere((screen == anchor).all(axis=2)):
        top, left = y - ay, x - ax
        if top < 0 or left < 0 or top + h > screen.shape[0] or left + w > screen.shape[1]:
            continue
        if np.array_equal(screen[top : top + h, left : left + w], image):
            return int(top), int(left)
    return None


def test_a_real_browser_shows_every_plot(tmp_path: Path) -> None:
    """Each figure must be drawn where the page puts it, exactly as encoded: a broken data URI, a
    figure scaled or clipped by the CSS, or one hidden, fails."""
    from PIL import Image

    report = dry_run_report()
    page = tmp_path / REPORT
    page.write_text(render(report))
    images = [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
        for *_, data in _IMG.findall(page.read_text())
    ]
    screen = screenshot(page, tmp_path, 1000, 3000)
    corners = [find(screen, img) for img in images]
    assert all(c is not None for c in corners), corners
    tops = [c[0] for c in corners if c is not None]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)  # in page order, one under another
    # The metrics table is drawn above the first figure: dark text pixels between the title and it.
    assert (screen[: tops[0]] < 80).all(axis=2).sum() > 2000


def test_the_length_figure_drawn_during_the_write_is_the_one_the_report_shows(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A job draws the report's length figure while assign+write runs (from the histogram's document
    lengths) and the report after the commit takes it: the page is byte for byte the one `raypack
    report` makes from the dataset alone, where nothing was drawn ahead."""
    from raypack.config import load_config
    from raypack.pipeline.job import run_job
    from raypack.report import plots
    from tests.conftest import job_config, make_corpus

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=30, seed=3)
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path)))
    plots._length_png.cache_clear()
    run_job(cfg, log=lambda _: None)
    assert plots._length_png.cache_info().hits == 1  # drawn once, ahead; the report's call a hit
    page = (tmp_path / "out" / REPORT).read_text()
    figure = _IMG.findall(page)[0][3]
    plots._length_png.cache_clear()
    assert main(["report", str(tmp_path / "out")]) == 0
    remade = (tmp_path / "out" / REPORT).read_text()
    assert _IMG.findall(remade)[0][3] == figure and remade == page
    assert plots._length_png.cache_info().misses == 1
