"""`raypack convert DATASET --format F --out DIR`: a finished dataset written again in another output
format, without tokenizing or packing again, so a team can keep one canonical dataset (parquet, say)
and give each trainer its own.

Every file's packs are read through the source's format and written through the target's, file for
file, by the runner's tasks (raypack.engine: local processes for a small dataset, else Ray;
one a run of files, retried like the job's storage tasks); `index/` and `rejects/`
are copied as they are; the manifest and metrics.json carry over with the new files and format and
a `converted_from` entry (the source's path and its manifest's sha256). The files are byte for byte
those `raypack pack` writes in that format (tests/test_formats.py), and the result is committed as a
job's is: manifest last, so a crash leaves no dataset that looks complete.

The driver holds the manifest (~1 KB a file) and one written row a file; a task one file's packs at
a time (4 bytes a token slot, plus the encoded files).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from raypack import schema
from raypack.config import JobConfig, RunConfig, StorageConfig, from_dict
from raypack.dataset import previous
from raypack.dataset.layout import MANIFEST, METRICS
from raypack.dataset.manifest import CONVERTED_SETTINGS, manifest_files, write_dataset_files
from raypack.dataset.output import check_output, clear_output, recover_output, restore_output
from raypack.engine import open_runner, transient
from raypack.errors import ConfigError, JobError
from raypack.formats import (
    Packs,
    Spec,
    data_file,
    make_spec,
    read_packs,
    settings_of,
    spec_of,
    stem_of_file,
    total_bytes,
)
from raypack.formats.files import loss_mask_of, write_packs
from raypack.paths import anchored
from raypack.reader import Pinned, pin
from raypack.report import write_report_safely
from raypack.storage import contains, exists, join, read_bytes, resolve, write_bytes, write_bytes_atomic

__all__ = ["ConvertResult", "convert"]

# Runs of files a CPU: a few, so that a slow file does not hold a whole share of the work.
RUNS_PER_CPU = 4


@dataclass(frozen=True)
class ConvertResult:
    source: str
    """The dataset read (for a rebuild's root: the version LATEST named)."""
    output: str
    format: dict[str, Any]
    """The new manifest's `format`."""
    files: int
    bytes: int
    """Of every file written: data files, their companions and the format's dataset files."""
    report: str | None


def packed_config(manifest: dict[str, Any]) -> JobConfig:
    """The config a dataset was packed with, as its manifest records it."""
    try:
        return from_dict(JobConfig, manifest["config"])
    except ConfigError as e:
        raise ConfigError(f"the dataset's manifest holds a config this raypack cannot read: {e}") from None


def target_spec(manifest: dict[str, Any], name: str, pad_id: int | None = None) -> Spec:
    """The Spec a dataset's packs take in format `name`, decided as the job decides it (settings_of)
    from the config it was packed with and its tokenizer record, or with padding of `pad_id`: a
    ConfigError where that format's trainer could not read them right (megatron for packs of several
    lengths, or for conversations; olmo for padding of EOS)."""
    cfg = packed_config(manifest)
    tok = manifest["tokenizer"]
    max_id = int(tok.get("max_id", int(tok["vocab_size"]) - 1))  # written before max_id was kept
    if pad_id is not None and not 0 <= pad_id <= max_id:
        raise ConfigError(f"--pad-id {pad_id} is no id of the dataset's tokenizer (0..{max_id})")
    pad = pad_id
    if pad is None:
        pad = int(tok.get("pad_id", cfg.output.pad_id if cfg.output.pad_id is not None else 0))
    spec = make_spec(name, settings_of(cfg, tok.get("eos_id"), max_id, pad, lengths=_lengths(manifest)))
    if pad_id is not None and spec.pad_id != pad_id:
        raise ConfigError(
            f"--pad-id: format {name} pads with id {spec.pad_id} (its trainer masks padding by it), "
            "whatever pad is given"
        )
    return spec


def _default_pad(manifest: dict[str, Any], name: str) -> int | None:
    """What a conversion to `name` pads with when given no pad (None where it refuses one)."""
    try:
        return target_spec(manifest, name).pad_id
    except ConfigError:
        return None


def _lengths(manifest: dict[str, Any]) -> list[int]:
    return [int(f["bucket_length"]) for f in manifest["files"]]


def convert(
    source: str,
    name: str,
    out: str,
    *,
    overwrite: bool = False,
    storage: StorageConfig | None = None,
    log: Callable[[str], None] = print,
    run: RunConfig | None = None,
    pad_id: int | None = None,
) -> ConvertResult:
    """`run`: where the tasks run (run.executor; default auto: this machine's processes for a
    dataset up to run.local_max_bytes, without a Ray cluster named or running). `pad_id`: what
    the new dataset's padding holds (None: what the dataset's does, where its format allows)."""
    storage = (storage or StorageConfig()).from_environment()
    source, out = anchored(source), anchored(out)  # the tasks' working directory is not this one
    try:
        pinned = pin(source, storage)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None
    manifest, dataset = pinned.manifest, pinned.path
    spec = target_spec(manifest, name, pad_id)
    if pad_id is not None and pad_id == _default_pad(manifest, name):
        pad_id = None  # the pad the conversion takes anyway: the config keeps saying so as it did
    if contains(dataset, out) or contains(out, dataset):
        raise ConfigError(f"--out {out} and the dataset {dataset} overlap: write the conversion elsewhere")
    recover_output(out, log)
    check_output(out, storage, overwrite)
    clear_output(out, storage)
    try:
        result = _convert(pinned, name, spec, out, storage, log, run, pad_id)
    except BaseException:
        restore_output(out, log, "conversion")  # the dataset it was to replace
        raise
    previous.discard(out)
    report = write_report_safely(out, storage, log)
    return dataclasses.replace(result, report=report)


def _convert(
    pinned: Pinned,
    name: str,
    spec: Spec,
    out: str,
    storage: StorageConfig,
    log: Callable[[str], None],
    run: RunConfig | None,
    pad_id: int | None,
) -> ConvertResult:
    """The conversion into the cleared `out`, up to its manifest (its report not drawn)."""
    manifest, dataset = pinned.manifest, pinned.path
    source_spec = spec_of(manifest)
    files = sorted(manifest["files"], key=lambda f: str(f["path"]))
    runner = open_runner(
        run or RunConfig(), total_bytes(files, (manifest.get("format") or {}).get("files", [])), None
    )
    try:
        runs = min(len(files), runner.width * RUNS_PER_CPU)
        log(
            f"[raypack] convert: {len(files):,} file{'' if len(files) == 1 else 's'} from {source_spec.name} "
            f"to {spec.name}, {runs} task{'' if runs == 1 else 's'} "
            f"on {runner.where}"
        )
        cuts = [len(files) * r // runs for r in range(runs + 1)]
        calls = [
            (dataset, files[a:b], source_spec, spec, out, storage, runner.patterns)
            for a, b in itertools.pairwise(cuts)
        ]
        tables = runner.map(convert_files, calls)
    except BaseException:
        runner.close(release=True, failed=True)
        raise
    runner.close(release=True)
    written = sorted((row for t in tables for row in t.to_pylist()), key=lambda f: str(f["path"]))
    _check_one_to_one(files, written, source_spec, spec)
    for part in ("index", "rejects"):
        if exists(join(dataset, part), storage):
            _copy_tree(join(dataset, part), join(out, part), storage)
    metrics = json.loads(read_bytes(join(dataset, METRICS), storage))
    metrics["format"] = spec.name
    write_bytes(join(out, METRICS), json.dumps(metrics, indent=2).encode(), storage)
    output_format = write_dataset_files(written, spec, out, storage)
    new = dict(manifest)
    new["schema_version"] = manifest["schema_version"] if spec.name == "parquet" else 2
    output = {**manifest["config"]["output"], "path": out, "format": name}
    if pad_id is not None:  # the new padding, as a job given output.pad_id records it
        output["pad_id"] = pad_id
        new["tokenizer"] = {**manifest["tokenizer"], "pad_id": pad_id, "pad_source": "output.pad_id"}
    new["config"] = {**manifest["config"], "output": output}
    new["files"] = manifest_files(written)
    new["format"] = output_format
    # The output settings the data was packed with (a converted dataset's first source's): what a
    # job config given to `raypack verify` still says.
    packed = manifest.get("converted_from", {}).get("packed_output") or {
        key: manifest["config"]["output"].get(key) for key in CONVERTED_SETTINGS
    }
    new["converted_from"] = {
        "path": dataset,
        "format": source_spec.name,
        "manifest_sha256": pinned.sha256,
        "packed_output": packed,
    }
    write_bytes_atomic(join(out, MANIFEST), json.dumps(new, indent=2).encode(), storage)
    size = total_bytes(written, output_format["files"])
    return ConvertResult(dataset, out, output_format, len(written), size, None)


def convert_files(
    dataset: str,
    entries: list[dict[str, Any]],
    source: Spec,
    spec: Spec,
    out: str,
    storage: StorageConfig,
    patterns: tuple[str, ...] | None,
) -> pa.Table:
    """Task: each file's packs read through `source`'s format, written through `spec`'s; their
    WRITTEN rows."""
    with transient(patterns):
        rows = [
            write_packs(_repadded(_source_packs(dataset, e, source, storage), spec), out, spec, storage)
            for e in entries
        ]
        return pa.concat_tables(rows) if rows else schema.WRITTEN.empty_table()


def _source_packs(dataset: str, entry: dict[str, Any], source: Spec, storage: StorageConfig) -> Packs:
    """One file's packs; a JobError naming it where its bytes make none (a file zeroed in place, its
    size unchanged), not a traceback of pyarrow's "Parquet magic bytes not found"."""
    try:
        return read_packs(dataset, entry, source, storage, checked=True)
    except ValueError as e:  # pyarrow's ArrowInvalid is one
        said = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise JobError(
            f"{join(dataset, entry['path'])} does not read as the {source.name} file its manifest lists "
            f"({said}): the dataset changed since it was written; `raypack verify {dataset}` checks it whole"
        ) from None


def _repadded(packs: Packs, spec: Spec) -> Packs:
    """The packs with spec's padding (megatron pads with EOS, the others with output.pad_id), and a
    loss mask where spec keeps one: the source's, or (plain text) every token but each item's first."""
    tokens = packs.input_ids.copy()
    tokens[~packs.real()] = spec.pad_id
    mask = packs.loss_mask if spec.loss_mask else None
    if spec.loss_mask and mask is None:  # the write stage's mask of tokens that are all trained
        mask = loss_mask_of(tokens, *packs.item_bounds(), spec, 0)
    return Packs(packs.stem, tokens, packs.index, mask)


def _check_one_to_one(
    files: list[dict[str, Any]], written: list[dict[str, Any]], source: Spec, spec: Spec
) -> None:
    """Each source file became the file of the same name (new suffix), packs, tokens and items."""
    if len(written) != len(files):
        raise RuntimeError(f"{len(files)} files read, {len(written)} written: refusing to commit")
    for src, new in zip(files, written, strict=True):
        name = data_file(stem_of_file(str(src["path"]), source.format.suffix), spec.format.suffix)
        counts = all(int(src[k]) == int(new[k]) for k in ("rows", "tokens", "items", "bucket_length"))
        if new["path"] != name or not counts:
            raise RuntimeError(f"{src['path']} became {new['path']} with other counts: refusing to commit")


def _copy_tree(src: str, dst: str, storage: StorageConfig) -> None:
    """Every file under src to the same place under dst, bytes as they are (pyarrow copies in threads)."""
    source_fs, source_path = resolve(src, storage)
    dest_fs, dest_path = resolve(dst, storage)
    dest_fs.create_dir(dest_path, recursive=True)
    pafs.copy_files(source_path, dest_path, source_filesystem=source_fs, destination_filesystem=dest_fs)
