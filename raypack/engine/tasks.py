"""What every job task that touches storage shares: one CPU, Ray's retries on a killed worker, and
transient storage errors told apart from the rest (a TransientStorageError is retried, after a
pause; any other error fails at once). The tokenize, scan, select, assign, merge, write and sharded
tasks all run with task_options() and inside transient(patterns)."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["RETRIES", "WORKER_ENV", "TransientStorageError", "task_options", "transient", "worker_env"]

# Transient storage errors (Ray Data's own list: AWS NETWORK_CONNECTION, SLOW_DOWN, 503...) are
# retried by Ray this many times, each after a jittered pause; a killed worker is retried as often.
RETRIES = 4
_PAUSE_S = (2.0, 6.0)


# Variables the local pool's processes start with, set in their environment only (the zygote's),
# never in the process that runs the job. tokenizers' and fastokens' thread pools would each take
# every core: N workers × N threads on N cores (two processes on 2 cores encode the demo corpus in
# ~16% less time with one thread each than with tokenizers' default pool). Ray's workers are left
# as Ray starts them: a task's runtime_env would have Ray start workers of their own for it (~3.5 s
# more for the tokenize stage of a job on a local Ray); fastokens takes one thread there by itself
# (text.backends._one_thread).
WORKER_ENV = {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}


def worker_env() -> dict[str, str]:
    """WORKER_ENV, a value set in this process's environment winning."""
    return {name: os.environ.get(name, value) for name, value in WORKER_ENV.items()}


class TransientStorageError(OSError):
    """A storage error that a later attempt may not meet: the task is retried by Ray."""


@contextmanager
def transient(patterns: tuple[str, ...] | None) -> Iterator[None]:
    """An OSError whose text holds one of `patterns` (None: Ray Data's defaults, read only when an
    OSError is met) leaves as a TransientStorageError, after a pause: Ray retries the task."""
    try:
        yield
    except OSError as e:
        if patterns is None:
            patterns = _retried_io_errors()
        if isinstance(e, TransientStorageError) or not any(p in str(e) for p in patterns):
            raise
        time.sleep(random.uniform(*_PAUSE_S))  # backoff before Ray's retry (it has none of its own)
        raise TransientStorageError(str(e).strip().splitlines()[0]) from e


def task_options() -> tuple[tuple[str, ...] | None, dict[str, Any]]:
    """The transient storage errors' patterns, and the options of every task that touches storage:
    one CPU, retried on a killed worker and on a TransientStorageError. The patterns are Ray Data's
    list: the driver's DataContext's where the driver has imported Ray Data (a user may have
    changed it), else None, for `transient` to read Ray Data's defaults on an error. Importing
    ray.data (and pandas) only to read that list would cost the driver 0.6-0.75 s, just as the
    tokenize workers start."""
    patterns = None
    if "ray.data" in sys.modules:
        patterns = _retried_io_errors()
    options = {"num_cpus": 1, "max_retries": RETRIES, "retry_exceptions": [TransientStorageError]}
    return patterns, options


def _retried_io_errors() -> tuple[str, ...]:
    import ray.data

    return tuple(ray.data.DataContext.get_current().retried_io_errors)
