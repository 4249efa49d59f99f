"""The tokenize task's side: what a worker process of the tokenize stage does with a work unit.
TokenizeShards turns a unit into its staged token file (raypack.pipeline.tokenize.token_files) and rejects,
and returns its summary (raypack.pipeline.place.histogram.summarize_shard). It runs as the runner's tasks
(raypack.pipeline.tokenize.pool) in worker processes that hold the job's tokenizer
(raypack.pipeline.tokenize.worker) and keep one TokenizeShards from one unit of a pass to the next.

With fastokens, a Checker (raypack.text.encode) re-encodes a seeded sample of each unit's pieces
with `tokenizers` within a fifth of the fast encoder's own time; on a difference the unit is
tokenized again with `tokenizers`, the summary says why, and the driver tokenizes every unit again
(raypack.pipeline.tokenize.stage). Tokens are computed once here; later stages only read these files.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from isal.isal_zlib import crc32

from raypack import mixture, schema
from raypack.config import JobConfig, StorageConfig
from raypack.corpus.metadata import metadata_array
from raypack.corpus.readers import Batch, Reject, read_unit
from raypack.corpus.readers.records import reason_counts
from raypack.corpus.units import WorkUnit
from raypack.dataset.layout import overflow_rejects_path, rejects_path
from raypack.engine import node_id
from raypack.paths import is_uri
from raypack.pipeline.tokenize.summary import summarize_shard
from raypack.pipeline.tokenize.token_files import (
    DONE,
    Checksum,
    cached_metadata_file,
    cached_rejects_file,
    read_finished,
    seal,
    staged_options,
)
from raypack.storage import atomic_output, open_output, read_bytes, whole_output, write_bytes
from raypack.text.backends import Encoder, Guarded, Mismatch, TokenizersEncoder
from raypack.text.encode import CheckBudget, Checker, encode_batch
from raypack.text.files import chat_template
from raypack.text.offsets import Coder, reference_coder

if TYPE_CHECKING:
    from raypack.pipeline.tokenize.worker import JobState

__all__ = ["TokenizeShards", "stored_unit"]

Tokenized = tuple[pa.Table, list[str], dict[str, Any], pa.StructArray | None]
"""A unit's documents (row, file, doc_id, length), its rejects' reasons, its completion key, and
its documents' metadata (None: none kept)."""


class TokenizeShards:
    """Tokenizes work units one at a time (unit): each names a shard and its token file, and gives the
    shard's summary. A token file that exists already (a token store's, a rebuild's cache) is reused
    by stored_unit, with no TokenizeShards made."""

    def __init__(self, cfg: JobConfig, backend: str, loaded: JobState, ahead: bool = False) -> None:
        self.cfg = cfg
        self.storage = cfg.storage
        self.run = loaded.ctx.run
        """The job's run id: its token files' temporaries carry it (store.remove_run_temporaries)."""
        self.tok = loaded.tok
        self.reference = TokenizersEncoder(self.tok.tokenizer)
        self.encoder: Encoder = self.reference
        self.failover = ""
        """Why this worker went back to tokenizers after a difference ("" while it has not)."""
        self.note = ""
        """Why it encodes with tokenizers though fastokens was chosen (not a difference: exact either way)."""
        self.refused = ""
        """Why it tokenizes nothing in this pass: it runs ahead of the check of a fastokens that did
        not load here, which the check will refuse too (its units would be tokenized again)."""
        self.fast = loaded.fast if backend == "fastokens" else None
        if backend == "fastokens":
            if loaded.fast is not None:
                self.encoder = Guarded(loaded.fast)
            elif ahead:
                # Taken, the units a worker gets before the check refuses would be tokenized by
                # tokenizers under fastokens' key, then discarded and tokenized again (~60% more time
                # for 50 MB with a 131k BPE whose Strip normalizer fastokens refuses). Refused at
                # once, they cost nothing.
                self.refused = f"fastokens did not load ({loaded.fast_error})"
            else:  # not installed on this node, or refused: the reference, said so
                self.note = (
                    f"fastokens did not load on a node ({loaded.fast_error}): tokenizers encoded there"
                )
        self._checker: Checker | None = None
        self._budget = CheckBudget()  # the in-run check's share, kept over this worker's units
        self._cuts = [0, 0, 0, 0]
        self._trained = 0
        self.template = chat_template(cfg, self.tok)
        # Chat data's mask needs each token's character offsets: tokenizers' own, or a byte-level
        # BPE's from the fast ids (chosen only where the self-check proved them equal).
        self.reference_coder = reference_coder(self.tok.tokenizer)
        self.coder: Coder = self.reference_coder
        if cfg.input.chat and self.encoder is not self.reference:
            offsets = self.tok.offsets()
            if offsets is None:
                self.encoder = self.reference
            else:
                routed = self.fast.routed if self.fast is not None else None
                self.coder = offsets.coder(self.encoder, self.reference_coder, routed)

    def unit(self, unit: WorkUnit) -> dict[str, Any]:
        """A work unit without a finished token file (tokenize_pool.tokenize_unit asked stored_unit
        first) tokenized into one; its summary, the row histogram.Totals.add folds. Writes its index
        and rejects into the output. In a pass that runs ahead of a check this worker's fastokens
        cannot pass: {"shard", "refused"} alone, nothing read or written."""
        if self.refused:
            return {"shard": unit.index, "refused": self.refused}
        docs, reasons, lost, metadata = self._tokenize_checked(unit)
        return _summary(self.cfg, unit, docs, lost, reasons, metadata) | self._backend_summary()

    def _tokenize_checked(self, unit: WorkUnit) -> Tokenized:
        """_tokenize with the chosen encoder and, for a fast one, a Checker; on a Mismatch the unit
        is tokenized again with tokenizers, which this worker keeps (the driver, told by the
        summary's failover, stops giving out units and tokenizes every unit again)."""
        self._checker = None
        if self.fast is not None:
            self.fast.routed[:] = [0, 0]  # this unit's texts fastokens' copy does not take
        if self.encoder is self.reference:
            return self._tokenize(unit)
        self._checker = Checker(self.reference, f"{unit.label}:{unit.shard.unit_start}", self._budget)
        try:
            return self._tokenize(unit)
        except Mismatch as e:
            self.failover = f"unit {unit.index} ({unit.label}): {e}"
            self.encoder, self.coder, self._checker = self.reference, self.reference_coder, None
            return self._tokenize(unit)

    def _backend_summary(self) -> dict[str, Any]:
        checker, fast = self._checker, self.fast
        return {
            "backend": self.encoder.name,
            "checked_texts": checker.texts if checker is not None else 0,
            "checked_segments": checker.segments if checker is not None else 0,
            "checked_bytes": checker.bytes if checker is not None else 0,
            "failover": self.failover,
            "note": self.note,
            "routed_texts": fast.routed[0] if fast is not None else 0,
            "routed_bytes": fast.routed[1] if fast is not None else 0,
        }

    def _long_texts(self) -> dict[str, Any]:
        """How this unit's long texts were encoded (text.cuts): how many there were, cuts made and
        refused, rests encoded whole, and the rule that allowed the cuts with its proof (\"\" where
        none was looked for). Kept in the token file too: a unit read from a token store reports
        what its tokens went through, not zeros."""
        made, refused, whole, texts = self._cuts
        rule = ""
        if made or refused or whole:
            found, why = self.tok.cut_rule()  # proven on this worker already (memoized)
            rule = f"{found.name}: {why}" if found is not None else why
        return {
            "long_texts": texts,
            "cuts": made,
            "cuts_refused": refused,
            "long_whole": whole,
            "cut_rule": rule,
        }

    def _tokenize(self, unit: WorkUnit) -> Tokenized:
        """Tokenize the unit into its token file; rejects go beside it and into the output.

        A local file is written under a temporary name and renamed when finished, so that another
        job reading the same token store never opens a part of it. On S3 it is written in place (a
        move is a CopyObject, limited to 5 GB, and a shard of 10 GB of text makes a ~10 GB token
        file): an upload is visible only once complete. Either way it counts as finished only by
        the key on its last record batch, written last (DONE, with the rejects count): an error
        mid-way closes the writer without it, and such a file is redone."""
        cfg = self.cfg
        path = unit.token_file
        rejects: list[dict[str, Any]] = []
        docs: list[pa.Table] = []
        meta: list[tuple[Any, ...]] = []
        self._trained = 0
        self._cuts = [0, 0, 0, 0]  # long texts (text.cuts): cuts, refused, with a piece over 1 MiB, texts
        # The rejects count is known only at the end: it goes on the last, empty record batch.
        with (
            whole_output(path, self.storage, self.run) as sink,
            pa.ipc.new_file(sink, schema.TOKENIZED, options=staged_options(path)) as writer,
        ):
            relpaths = unit.relpaths
            checksum = Checksum()
            for batch in read_unit(unit, cfg.tokenizer.batch_size, self.storage):
                rejects.extend(r.as_row(relpaths) for r in batch.rejects)
                if len(batch):
                    table = self._encode(batch, unit, rejects, meta)
                    writer.write_table(table)
                    checksum.add(table)
                    docs.append(table.select(["row", "file", "doc_id", "length"]))
            rejects_crc = None
            if rejects:
                table = pa.Table.from_pylist(rejects, schema=schema.REJECTS)
                buffer = pa.BufferOutputStream()
                pq.write_table(table, buffer)
                data = buffer.getvalue().to_pybytes()
                rejects_crc = crc32(data)
                # Beside the token file before its completion key, so a finished token file always
                # has its rejects.
                with atomic_output(cached_rejects_file(path), self.storage, self.run) as f:
                    f.write(data)
                with open_output(rejects_path(cfg.output.path, unit.index), self.storage) as f:
                    f.write(data)
            metadata, metadata_crc = None, None
            if unit.reading.metadata_fields:  # beside the token file too, before its completion key
                metadata = metadata_array(unit.reading.metadata_fields, meta)
                metadata_crc = self._write_metadata(metadata, path)
            lost = {
                "rejects": len(rejects),
                "records": sum(r["records"] for r in rejects),
                "lost_files": sum(r["lost_file"] for r in rejects),
                "trained": self._trained,
                **self._long_texts(),
                "crc32": checksum.crcs,
                **({"rejects_crc32": rejects_crc} if rejects_crc is not None else {}),
                **({"metadata_crc32": metadata_crc} if metadata_crc is not None else {}),
            }
            lost = seal(lost, path)
            done = pa.RecordBatch.from_pylist([], schema=schema.TOKENIZED)
            writer.write_batch(done, custom_metadata={DONE: json.dumps(lost).encode()})
        empty = schema.TOKENIZED.empty_table().select(["row", "file", "doc_id", "length"])
        return pa.concat_tables(docs) if docs else empty, [r["reason"] for r in rejects], lost, metadata

    def _tails(
        self, batch: Batch, lengths: np.ndarray, unit: WorkUnit, rejects: list[dict[str, Any]]
    ) -> None:
        """A reject for each document whose last tokens decompose's rule leaves out (its length past a
        multiple of pack.min_seq_len, after pack.overflow): the document is packed, so the reject
        stands for no record; index.length - index.placed are its tokens."""
        pack = self.cfg.pack
        low = pack.min_seq_len or 1
        if pack.algorithm != "decompose" or low == 1:
            return
        some = np.flatnonzero(lengths > 0)
        placed = pack.make_items(lengths[some]).placed_per_doc()
        kept = mixture.kept(lengths[some], pack.seq_len, pack.overflow)
        tail = f"decompose: its last tokens past a multiple of pack.min_seq_len ({low}) are in no chunk"
        whole = f"decompose: shorter than pack.min_seq_len ({low}), the whole document is in no chunk"
        cut = kept > placed
        for i, none in zip(some[cut].tolist(), (placed[cut] == 0).tolist(), strict=True):
            reject = Reject.cut(batch.rows[i], whole if none else tail, str(batch.texts[i]))
            file = batch.files[i] if batch.files is not None else 0
            rejects.append(dataclasses.replace(reject, file=file).as_row(unit.relpaths))

    def _write_metadata(self, metadata: pa.StructArray, path: str) -> int:
        """The unit's documents' metadata, written beside its token file; its bytes' CRC-32."""
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.table({"metadata": metadata}), buffer, compression="zstd")
        data = buffer.getvalue().to_pybytes()
        with atomic_output(cached_metadata_file(path), self.storage, self.run) as f:
            f.write(data)
        return crc32(data)

    def _encode(
        self, batch: Batch, unit: WorkUnit, rejects: list[dict[str, Any]], meta: list[tuple[Any, ...]]
    ) -> pa.Table:
        """The batch's documents encoded, as token file rows; those that give no token rejected.
        Each kept document's metadata goes on `meta`."""
        chat = unit.reading.chat is not None
        flat, lengths, why = encode_batch(
            self.tok,
            self.cfg,
            self.template,
            batch.texts,
            chat,
            self.encoder,
            self.coder,
            self._checker,
            self._cuts,
        )
        self._trained += int(np.count_nonzero(flat >= 0)) if chat else len(flat)
        self._tails(batch, lengths, unit, rejects)
        empty = np.flatnonzero(lengths == 0)
        if empty.size:  # plain text without BOS/EOS that the tokenizer maps to nothing; chat rejects
            for i in empty.tolist():
                file = batch.files[i] if batch.files is not None else 0
                reject = Reject.bad(batch.rows[i], str(why[i]), str(batch.texts[i]))
                rejects.append(dataclasses.replace(reject, file=file).as_row(unit.relpaths))
            keep = np.flatnonzero(lengths > 0).tolist()
            lengths = lengths[keep]
            files = None if batch.files is None else [batch.files[i] for i in keep]
            kept = [batch.meta[i] for i in keep]
            batch = Batch(rows=[batch.rows[i] for i in keep], ids=[batch.ids[i] for i in keep], files=files)
            batch.meta = kept
        meta += batch.meta
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        return pa.table(
            {
                "row": pa.array(batch.rows, pa.int64()),
                "file": np.zeros(len(lengths), np.int32)
                if batch.files is None
                else pa.array(batch.files, pa.int32()),
                "doc_id": batch.ids,
                "length": lengths,
                "tokens": tokens,
            },
            schema=schema.TOKENIZED,
        )


def stored_unit(cfg: JobConfig, unit: WorkUnit) -> dict[str, Any] | None:
    """A unit's summary from its finished token file (a token store's entry, a rebuild's cache, a
    retried task's), its rejects copied into the output; None where it has none, or its rejects
    file is missing (a store copied in part): it is tokenized then. Needs no tokenizer: a unit found
    here runs in a worker that never loaded one (raypack.pipeline.tokenize.pool), so a repack whose
    every unit is stored starts without the ~2-3 s of loading a 128k BPE and fastokens' copy."""
    path, storage = unit.token_file, cfg.storage
    finished = read_finished(path, storage)
    if finished is None:
        return None
    docs, lost = finished
    reasons: list[str] = []
    if lost["rejects"]:
        found = _beside(cached_rejects_file(path), lost.get("rejects_crc32"), storage, "reason")
        if found is None:
            return None
        data, table = found
        reasons = table.column("reason").to_pylist()
        write_bytes(rejects_path(cfg.output.path, unit.index), data, storage)
    metadata = None
    if unit.reading.metadata_fields:  # (its key says metadata_fields: it was written with them)
        found = _beside(cached_metadata_file(path), lost.get("metadata_crc32"), storage, "metadata")
        if found is None:
            return None
        metadata = found[1].column("metadata").combine_chunks()
    if not is_uri(path):  # a local store's entry was used now (prune goes by this time)
        with suppress(OSError):
            os.utime(path)
    return _summary(cfg, unit, docs, lost, reasons, metadata, cached=True) | {
        "backend": "cache",
        "checked_texts": 0,
        "checked_segments": 0,
        "checked_bytes": 0,
        "failover": "",
        "note": "",
        "routed_texts": 0,
        "routed_bytes": 0,
    }


def _overflow_rejects(cfg: JobConfig, unit: WorkUnit, docs: pa.Table) -> list[str]:
    """A reject for each of the unit's documents whose tokens pack.overflow leaves out (truncate:
    those past seq_len; drop: all of them), in its overflow rejects file (layout: this job's, beside
    the unit's rejects); their reasons. The document stays in the index (placed: what the packs
    hold), so each stands for no record; its raw text is not kept (a stored unit is not read)."""
    pack = cfg.pack
    if pack.overflow == "split":
        return []
    over = np.flatnonzero(docs.column("length").to_numpy() > pack.seq_len)
    if not len(over):
        return []
    reason = (
        f"overflow truncate: its tokens past seq_len ({pack.seq_len}) are in no pack"
        if pack.overflow == "truncate"
        else f"overflow drop: longer than seq_len ({pack.seq_len}), the whole document is in no pack"
    )
    files = docs.column("file").to_numpy()[over].tolist()
    rows = [
        dataclasses.replace(Reject.cut(row, reason), file=file).as_row(unit.relpaths)
        for row, file in zip(docs.column("row").to_numpy()[over].tolist(), files, strict=True)
    ]
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.REJECTS), buffer)
    data = buffer.getvalue().to_pybytes()
    write_bytes(overflow_rejects_path(cfg.output.path, unit.index), data, cfg.storage)
    return [reason] * len(rows)


def _beside(
    path: str, crc: int | None, storage: StorageConfig | None, column: str
) -> tuple[bytes, pa.Table] | None:
    """A Parquet file beside a stored token file (its rejects, its metadata): its bytes and its
    `column`; None where it is missing, or damaged or unreadable since it was written (its CRC-32,
    where the completion key has one): the unit is tokenized again then."""
    try:
        data = read_bytes(path, storage)
        if crc is not None and crc32(data) != crc:
            return None
        return data, pq.read_table(pa.BufferReader(data), columns=[column])
    except FileNotFoundError:
        return None
    except Exception:
        # Unreadable since (a flipped byte makes pyarrow raise OSError, UnicodeDecodeError):
        # tokenized again. On object storage an OSError may be the network's: the task's.
        if is_uri(path):
            raise
        return None


def _summary(
    cfg: JobConfig,
    unit: WorkUnit,
    docs: pa.Table,
    lost: dict[str, Any],
    reasons: list[str],
    metadata: pa.StructArray | None,
    cached: bool = False,
) -> dict[str, Any]:
    """The summary of a unit's documents (row, file, doc_id, length), metadata and rejects, but
    the backend's part (which encoder, what it checked and cut)."""
    doc_length = docs.column("length").to_numpy()
    summary = summarize_shard(
        cfg,
        unit,
        docs.column("doc_id").combine_chunks(),
        docs.column("row").combine_chunks(),
        docs.column("file").combine_chunks(),
        doc_length,
        metadata,
    )
    overflow = _overflow_rejects(cfg, unit, docs)
    return {
        "shard": unit.index,
        "node": node_id(),
        "cached": cached,
        "documents": len(doc_length),
        "tokens": int(doc_length.sum()),
        "rejects": lost["rejects"] + len(overflow),
        "rejected_records": lost["records"],
        "lost_files": lost["lost_files"],
        "reasons": json.dumps(reason_counts(reasons + overflow)),
        # Trained tokens (chat data's loss mask; every token of plain text): a file written before
        # the count was kept trains every token it holds.
        "trained": int(lost.get("trained", doc_length.sum())),
        # How its long texts were encoded, when its tokens were made (TokenizeShards._long_texts);
        # a file written before these were kept says nothing of them, and is counted as such (not
        # as a unit without long texts).
        "cuts": int(lost.get("cuts", 0)),
        # -1: a file written before the count of its long texts was kept (Totals.long_texts None).
        "long_texts": int(lost.get("long_texts", -1)),
        "cuts_refused": int(lost.get("cuts_refused", 0)),
        "long_whole": int(lost.get("long_whole", 0)),
        "cut_rule": str(lost.get("cut_rule", "")),
        "long_unrecorded": int("cut_rule" not in lost),
        **summary,
    }
