"""The manifest's views of what a dataset holds, as the job writes them and the tools around a
dataset (verify, convert, report, the reader) read them: its data files (`files`), the format's own
files of the whole dataset (`format`), each work unit's input files (`inputs`), and the metadata
its index keeps of each document (`metadata`). The rest of the manifest is the run's record
(raypack.pipeline.record)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from raypack.config import StorageConfig
from raypack.corpus.metadata import KINDS
from raypack.formats import Spec
from raypack.storage import join, write_bytes

__all__ = [
    "CONVERTED_SETTINGS",
    "dataset_files",
    "describe_sample",
    "entry_files",
    "format_entry",
    "manifest_files",
    "metadata_kinds",
    "packed_settings",
    "write_dataset_files",
]


CONVERTED_SETTINGS = ("format", "pad_id")
"""The output settings `raypack convert` changes: a converted dataset's manifest records them as
converted and, under converted_from.packed_output, as the data was first packed."""


def packed_settings(manifest: dict[str, Any]) -> dict[str, list[Any]]:
    """Each output setting a converted dataset may be verified with: as converted, or as first
    packed ({} for a dataset never converted; a setting of a conversion that recorded no
    packed_output takes any value)."""
    converted = manifest.get("converted_from")
    if not converted:
        return {}
    now = manifest.get("config", {}).get("output", {})
    packed = converted.get("packed_output")
    if packed is None:
        return {key: [] for key in CONVERTED_SETTINGS}
    return {key: [now.get(key), packed.get(key)] for key in CONVERTED_SETTINGS}


def describe_sample(sample: dict[str, Any] | None) -> str | None:
    """The manifest's `sample` (a trial, input.limit_bytes) in words; None for a whole corpus packed
    without a limit."""
    if not sample:
        return None
    took, of = sample["bytes"] / 2**20, sample["of_bytes"] / 2**20
    if sample["bytes"] >= sample["of_bytes"]:
        whole = f"{of:,.1f} MiB, {sample['of_files']:,} files"
        return f"a trial (input.limit_bytes) that took the whole corpus: {whole}"
    return (
        f"a trial on {took:,.1f} MiB of {of:,.1f} MiB ({sample['files']:,} of {sample['of_files']:,} files; "
        "input.limit_bytes): not the whole corpus"
    )


_FILE_KEYS = ("path", "bucket_length", "rows", "tokens", "items", "bytes", "sha256", "index")
# Kept in the manifest too: what bridge's pack_metadata.json is made from (and verify remakes it).
_FILE_STATS = ("max_items", "longest_item", "fewest_tokens", "trained")


def metadata_kinds(manifest: dict[str, Any]) -> dict[str, str]:
    """The kind (raypack.corpus.metadata.KINDS) of each metadata field the index keeps, in the
    index's order; {} for a dataset that keeps none (input.metadata_fields unset, or made before)."""
    found = manifest.get("metadata")
    if not found:
        return {}
    by_type = {str(t): kind for kind, t in KINDS.items()}
    return {name: by_type[found["types"][name]] for name in found["fields"]}


def manifest_files(files: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's `files`, from the write tasks' WRITTEN rows."""
    return [
        {k: f[k] for k in _FILE_KEYS}
        | {k: int(f[k]) for k in _FILE_STATS if k in f}
        | {"row_groups": [int(n) for n in f["row_groups"]], "companions": list(f["companions"])}
        for f in files
    ]


def dataset_files(files: Sequence[dict[str, Any]], spec: Spec, out: str) -> dict[str, bytes]:
    """The format's files of the whole dataset (Megatron's data-args list, Bridge's pack metadata), by
    path: written before the manifest, which lists them."""
    return spec.format.dataset_files(list(files), spec, out)


def format_entry(files: Sequence[dict[str, Any]], spec: Spec, made: dict[str, bytes]) -> dict[str, Any]:
    """The manifest's `format`: the Spec, the dataset files `made`, and the EOS tokens found inside
    documents (where an EOS-bounded trainer cuts one)."""
    listed = [{"path": p, "bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in made.items()]
    return {**spec.to_dict(), "files": listed, "stray_eos": sum(int(f.get("stray_eos", 0)) for f in files)}


def write_dataset_files(
    files: Sequence[dict[str, Any]], spec: Spec, out: str, storage: StorageConfig | None
) -> dict[str, Any]:
    """The format's files of a whole dataset written (raypack convert), and the manifest's `format`."""
    made = dataset_files(files, spec, out)
    for path, data in made.items():
        write_bytes(join(out, path), data, storage)
    return format_entry(files, spec, made)


def entry_files(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The files (path, size, mtime_ns) of a manifest `inputs` entry, in the unit's order; a Ray
    Dataset's unit as one of its name (`path` only: its documents' ids and mixture keys hold it)."""
    if "dataset" in entry:
        return [{"path": entry["dataset"]}]
    return list(entry.get("files", [entry]))
