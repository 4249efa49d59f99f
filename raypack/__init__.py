"""raypack: turn sharded text corpora into packed token sequences for LLM training, on Ray.

Used from Python, it runs what `raypack pack` runs:

    import raypack

    record = raypack.pack("job.yaml", overwrite=True)                # or a dict, or a loaded config
    assert raypack.verify(record.output, raypack.load_config("job.yaml")).ok

Each call is a job of its own: it loads its own tokenizer and starts its own workers (this
machine's processes for a small corpus, else Ray), so two calls in one process write what two
`raypack pack` commands write.
"""

import typing as _typing

if _typing.TYPE_CHECKING:  # (names for the annotations only: the package's namespace is __all__)
    import os
    from collections.abc import Callable, Sequence
    from typing import Any, TextIO

    from raypack.config import JobConfig
    from raypack.pipeline.record import RunRecord
    from raypack.verifier import VerifyReport

from raypack._version import __version__

__all__ = ["__version__", "load_config", "pack", "verify"]


def load_config(
    config: "str | os.PathLike[str] | dict[str, Any] | JobConfig", overrides: "Sequence[str] | str" = ()
) -> "JobConfig":
    """A job config from a YAML file's path, a mapping of its sections, or a loaded config, with
    `key.path=value` overrides (as `--set` takes them) applied; a ConfigError naming what is wrong."""
    from raypack.config import load_config as load

    return load(config, overrides)


def pack(
    config: "str | os.PathLike[str] | dict[str, Any] | JobConfig",
    *,
    overwrite: bool = False,
    overrides: "Sequence[str] | str" = (),
    log: "Callable[[str], None] | None" = None,
    progress: "TextIO | None" = None,
    dataset: "Any" = None,
) -> "RunRecord":
    """Pack the corpus `config` describes into its output.path, as `raypack pack` does, and return the
    run's record (what metrics.json and the summary hold). `overwrite`: replace a dataset already
    there; `overrides`: `key.path=value` settings; `log`: where the [raypack] lines go (default:
    stderr, as the command; `lambda _: None` for none); `progress`: where the stages' progress goes
    (default: none). A Ray this call starts is shut down before it returns; one the caller runs
    stays theirs. ConfigError or JobError (one line) for what the user can fix, StorageError when
    storage failed after every retry.

    `dataset`: the input as a `ray.data.Dataset` whose rows carry input.text_field (or the chat
    fields, and input.id_field if set), in place of input.paths; or {source name: Dataset} for
    sources of input.sources without paths. Its rows are read in the Dataset's order, input.unit_rows
    a work unit, ids from input.id_field or `dataset:<row>` (`<source>:<row>`): the same bytes
    whatever its blocks (raypack.corpus.datasets). Runs on the Ray the Dataset lives in."""
    datasets, overrides = _datasets(dataset, overrides)
    from raypack.engine import start_local

    # Its zygote imports beside the config's and the job's imports, as the CLI's; not for a Dataset,
    # which Ray tasks read.
    local = start_local() if datasets is None else None
    try:
        from raypack.pipeline.job import run_job

        cfg = load_config(config, overrides)
        say = log if log is not None else _to_stderr
        return run_job(
            cfg,
            overwrite=overwrite,
            log=say,
            release_ray=True,
            progress=progress,
            local=local,
            datasets=datasets,
        )
    finally:
        if local is not None:  # (the job closes it when it runs; this is for one that did not)
            local.close(release=False, failed=True)


def _to_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def verify(
    output: str,
    config: "str | os.PathLike[str] | dict[str, Any] | JobConfig | None" = None,
    sample: int = 64,
    dataset: "Any" = None,
) -> "VerifyReport":
    """Check the dataset at `output` (or the version a rebuild root's LATEST names): every document
    present exactly once, files and counts as the manifest says; with `config`, also that its
    tokenizer and pack settings are the manifest's and that `sample` documents re-tokenize to the
    tokens packed. The report's `ok` and `problems` say what was found. `dataset`: the Ray Dataset
    (or {source: Dataset}) the job read, as given to pack(), for the sample to re-read; it needs
    `config`."""
    from raypack.verifier import datasets_override
    from raypack.verifier import verify as check

    datasets, _ = _datasets(dataset, ())
    if datasets is not None and config is None:
        raise TypeError("raypack.verify(dataset=...) re-reads a sample as the job did: give its config too")
    # The sources the job read as Datasets, named as raypack.pack named them.
    cfg = load_config(config, datasets_override(output)) if config is not None else None
    return check(output, cfg, sample=sample, datasets=datasets)


def _datasets(
    dataset: "Any", overrides: "Sequence[str] | str"
) -> "tuple[dict[str, Any] | None, Sequence[str] | str]":
    """pack's and verify's `dataset` by source name (None: none given), and the overrides with
    input.datasets naming them."""
    if dataset is None:
        return None, overrides
    import json

    from raypack.corpus.datasets import as_datasets

    datasets = as_datasets(dataset)
    given = [overrides] if isinstance(overrides, str) else list(overrides)
    return datasets, [*given, f"input.datasets={json.dumps(sorted(datasets))}"]
