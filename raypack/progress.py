"""Progress of a long stage on stderr, from what the driver already receives (a unit's summary, a
writer's files): done of total, MB/s, an ETA. On a terminal one line redrawn in place (a bar), at
most 10 times a second; elsewhere (a log file, `ray job submit`'s output) a plain line every
LOG_EVERY_S seconds and one at the end, so a log shows the job is alive without filling up.
"""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["LOG_EVERY_S", "Progress"]

LOG_EVERY_S = 5.0
_REDRAW_S = 0.1
_BAR = 24


class Progress:
    def __init__(self, stage: str, total: int, what: str, total_bytes: int = 0, stream: TextIO | None = None):
        """`total` things (`what`: "units", "files") of `total_bytes` bytes of input in all (0: no
        MB/s); nothing is shown without a stream."""
        self.stage, self.total, self.what, self.total_bytes = stage, max(total, 0), what, total_bytes
        self.stream = stream
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.done = self.bytes = 0
        self.printed = -1  # `done` when a log line was last written
        self.start = self.shown = time.monotonic()

    def advance(self, things: int = 1, nbytes: int = 0) -> None:
        self.done += things
        self.bytes += nbytes
        now = time.monotonic()
        if self.stream is not None and now - self.shown >= (_REDRAW_S if self.tty else LOG_EVERY_S):
            self.shown = now
            self._show(now)

    def close(self) -> None:
        """The last state, on a line of its own (a log that just got it does not get it twice)."""
        if self.stream is not None and self.total and (self.tty or self.printed != self.done):
            self._show(time.monotonic(), final=True)

    def line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        share = self.done / self.total if self.total else 1.0
        parts = [f"[raypack] {self.stage} {self.done:,}/{self.total:,} {self.what}"]
        if self.tty:
            filled = round(_BAR * share)
            parts.append("[" + "#" * filled + "." * (_BAR - filled) + "]")
        parts.append(f"{share:.0%}")
        if self.total_bytes:
            parts.append(f"{self.bytes / 1e6 / elapsed:.1f} MB/s")
        if 0 < self.done < self.total:
            parts.append(f"ETA {_duration(elapsed * (self.total - self.done) / self.done)}")
        else:
            parts.append(f"in {_duration(elapsed)}")
        return "  ".join(parts)

    def _show(self, now: float, final: bool = False) -> None:
        assert self.stream is not None
        text = self.line(now)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
            self.printed = self.done
        self.stream.flush()


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
