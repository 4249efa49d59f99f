"""Failures a user can fix or rerun past: one line each; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import builtins
import re

__all__ = ["ConfigError", "JobError", "StorageError", "storage_cause", "task_raised"]


class ConfigError(ValueError):
    """A wrong setting or a missing file the user named: one line, exit code 2."""


class JobError(RuntimeError):
    """The input cannot make a dataset (e.g. every record rejected): one line, exit code 1."""


class StorageError(OSError):
    """Storage failed after every retry (the S3 client's and Ray's): one line, exit code 1; a rerun
    finishes the job (nothing was committed without its manifest)."""


# OSError and its builtin subclasses (FileNotFoundError, ConnectionResetError, TimeoutError, ...).
_OS_ERRORS = sorted(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, OSError)
)
# A traceback's exception line, e.g. "OSError: When uploading part ...: AWS Error NETWORK_CONNECTION".
_OS_ERROR_LINE = re.compile(rf"^(?:builtins\.)?({'|'.join(_OS_ERRORS)}): (.+)$", re.MULTILINE)


def storage_cause(e: BaseException) -> str | None:
    """The first line of the storage error (an OSError) behind `e`, or None if there is none.

    In-process, that is the innermost OSError of the __cause__ / __context__ chain. From a Ray task it
    can only be read from text: Ray Data raises a UserCodeException from the task's OSError, and the
    RayTaskError that reaches the driver keeps the worker's traceback as a string, not the exception
    objects (the OSError is not in any `.cause` or `__cause__` there). The traceback prints the root
    cause first, so its first OSError line is the one wanted."""
    found: str | None = None
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        raised = task_raised(current)
        if raised is not current:
            current = raised
            continue
        if isinstance(current, OSError):
            found = _first_line(str(current)) or type(current).__name__
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    if found is None and type(e).__module__.startswith("ray."):
        match = _OS_ERROR_LINE.search(str(e))
        found = match.group(2).strip() if match else None
    return found


def task_raised(e: BaseException) -> BaseException:
    """The exception a task raised: a plain Ray task's error, RayTaskError(X), is an X too, but its
    text is Ray's header ("ray::fast_encode() (pid=..., ip=...)") and the worker's traceback; the
    task's own exception is its .cause. Anything else is itself."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and any(c.__name__ == "RayTaskError" for c in type(e).__mro__):
        return cause
    return e


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""
