"""The two kinds of failure a user causes and can fix; anything else is a bug and keeps its traceback."""

from __future__ import annotations

__all__ = ["ConfigError", "JobError"]


class ConfigError(ValueError):
    """A configuration or environment mistake found before any work: one line, exit code 2."""


class JobError(RuntimeError):
    """The input cannot make a dataset (e.g. every record rejected): one line, exit code 1."""
