"""`raypack inspect`: one pack of a finished dataset decoded back to text, what a user reads first to
trust it. Each item (a document, or a chunk of one) in order: its id, which chunk it is, its tokens
and its text, decoded by `tokenizers` with the dataset's tokenizer; the dataset's BOS, EOS and pad
ids shown as ⟨bos⟩, ⟨eos⟩ and ⟨pad⟩ wherever they are; the padding counted; and, where the dataset
keeps a loss mask (chat data), the tokens that are not trained marked.

The pack is read as raypack's reader reads it (raypack.formats.read_rows: the row group holding it,
its tokens through the format's own files), so every output format shows the same. Packs are
numbered across the dataset's files in path order (as read_packed gives them), from 0.

An item's text is tokenizers' decode of its ids (special tokens as their strings); the parts
shown apart (a marker, an untrained span) are cut from decodes of growing prefixes of the ids, so
that what is shown is that text: decoding a part alone would lose a SentencePiece word's space or a
character split across two tokens.
"""

from __future__ import annotations

import itertools
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.config import StorageConfig, TokenizerConfig
from raypack.dataset.layout import index_path
from raypack.dataset.manifest import entry_files
from raypack.errors import ConfigError
from raypack.formats import item_spans, read_rows, spec_of
from raypack.reader import Pinned, pin
from raypack.schema import row_group_rows
from raypack.storage import join, resolve

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["Item", "PackView", "inspect_pack", "json_record", "render"]

ELIDE_CHARS = 200
"""Characters kept at each end of a long item's text (--full: all of it)."""
ELIDE_IDS = 16
"""Ids kept at each end of a long item's ids (--ids)."""
_PREFIX_DECODES = 256
"""Most parts an item is cut into by prefix decodes (each decodes the item up to there); past it,
each part is decoded alone (an item of thousands of stray EOS would otherwise be quadratic)."""
_SCAN_SHARDS = 64
"""Index files read whole to find documents whose id names no input file (an id_field's ids):
at most this many; above, their chunk counts are left unknown (one GET a shard on object storage)."""
MARKERS = ("pad", "bos", "eos")
"""The dataset's special ids shown as ⟨name⟩; where two are one id, the later name wins (megatron
pads with EOS: ⟨eos⟩)."""
_SHOWN = ("bos", "eos", "pad")  # the overview's order


@dataclass(frozen=True, slots=True)
class Part:
    """A run of an item's tokens shown alike: its text, whether it is a marker, and whether its
    tokens are untrained (loss mask 0)."""

    start: int
    end: int
    text: str
    marker: bool
    untrained: bool


@dataclass(frozen=True)
class Item:
    doc_id: str
    chunk_index: int
    start: int
    """Its first position in the pack (doc_offsets)."""
    end: int
    ids: np.ndarray
    mask: np.ndarray | None
    """The loss mask of its tokens (1: a trained target), where the dataset keeps one."""
    chunks: int | None
    """Its document's items in the dataset (index/: `chunks`), where known."""
    length: int | None
    """Its document's tokens before any cut (index/: `length`), where known."""
    parts: list[Part]
    """Empty without a tokenizer."""
    text: str | None
    """tokenizers' decode of its ids, special tokens as their strings; None without a tokenizer."""

    def untrained_spans(self) -> list[list[int]]:
        """[start, end) pack positions of its runs of loss mask 0 (each item's first token among
        them: it is no one's target)."""
        if self.mask is None:
            return []
        zero = np.r_[False, self.mask == 0, False].astype(np.int8)
        edges = np.flatnonzero(np.diff(zero))
        return [
            [self.start + int(a), self.start + int(b)] for a, b in zip(edges[::2], edges[1::2], strict=True)
        ]


@dataclass(frozen=True)
class PackView:
    pinned: Pinned
    number: int
    packs: int
    file: str
    row: int
    """The pack's row in its file."""
    capacity: int
    num_tokens: int
    pad_id: int
    items: list[Item]
    masked: bool
    tokenizer: str
    tokenizer_note: str | None
    """Why the text is not shown (the tokenizer unreadable), or why it may be wrong."""
    names: dict[int, str]
    """Marker name of each special id shown as one (MARKERS)."""
    token_strings: dict[int, str]
    """Those ids' token strings, where the tokenizer was read."""


def inspect_pack(
    path: str, number: int | None = None, tokenizer: str | None = None, storage: StorageConfig | None = None
) -> PackView:
    """Pack `number` (None: the first) of the dataset at `path` (or the version its LATEST names),
    decoded with the tokenizer the manifest names, or `tokenizer`. ConfigError (one line) for a path
    that holds no dataset or a pack out of range; a tokenizer that cannot be read leaves the text out
    and says why (PackView.tokenizer_note)."""
    pinned = _pinned(path, storage)
    manifest = pinned.manifest
    spec = spec_of(manifest)
    files = sorted(manifest["files"], key=lambda f: f["path"])
    starts = np.r_[0, np.cumsum([int(f["rows"]) for f in files])].astype(np.int64)
    packs = int(starts[-1])
    number = 0 if number is None else number
    if not 0 <= number < packs:
        held = f"packs 0..{packs - 1}" if packs else "no packs"
        raise ConfigError(f"pack {number} is out of range: {pinned.path} has {held}")
    e = int(np.searchsorted(starts, number, side="right") - 1)
    row = number - int(starts[e])
    table = _read_pack(pinned.path, files[e], spec, row, storage)
    tok, where, note = _decoder(manifest, tokenizer, storage)
    special = _special_ids(manifest, spec.pad_id)
    names = {i: name for name, i in special.items() if i is not None}  # MARKERS' order: eos wins
    strings = {i: s for i in names if tok is not None and (s := tok.id_to_token(i)) is not None}
    items = _items(table, tok, names, special["bos"], _documents(pinned, table, storage))
    return PackView(
        pinned=pinned,
        number=number,
        packs=packs,
        file=str(files[e]["path"]),
        row=row,
        capacity=int(files[e]["bucket_length"]),
        num_tokens=int(table.column("num_tokens")[0].as_py()),
        pad_id=spec.pad_id,
        items=items,
        masked=spec.loss_mask,
        tokenizer=where,
        tokenizer_note=note,
        names=names,
        token_strings=strings,
    )


def _pinned(path: str, storage: StorageConfig | None) -> Pinned:
    try:
        return pin(path, storage)
    except FileNotFoundError as e:
        raise ConfigError(f"{e} (raypack inspect reads a dataset, or a rebuild's root)") from None
    except ValueError as e:  # a manifest that is no JSON, or of a newer raypack
        raise ConfigError(f"{path}: cannot read its manifest.json: {str(e).splitlines()[0]}") from None


def _read_pack(dataset: str, entry: dict[str, Any], spec: Any, row: int, storage: Any) -> pa.Table:
    """Row `row` of a file: the row group holding it, read as the reader reads one, sliced."""
    rows = entry.get("row_groups")
    try:
        if rows is None:  # a dataset written before manifests listed row groups: read the footer
            fs, inner = resolve(join(dataset, entry.get("index") or entry["path"]), storage)
            with fs.open_input_file(inner) as handle:
                rows = row_group_rows(pq.ParquetFile(handle).metadata)
        firsts = np.r_[0, np.cumsum(rows)].astype(np.int64)
        group = int(np.searchsorted(firsts, row, side="right") - 1)
        more = ("doc_ids", "chunk_index")
        table = read_rows(dataset, entry, spec, group, int(firsts[group]), storage, more=more)
    except FileNotFoundError:
        raise ConfigError(
            f"{join(dataset, entry['path'])}: listed in the manifest but missing (raypack verify checks "
            "every file)"
        ) from None
    return table.slice(row - int(firsts[group]), 1)


def _decoder(
    manifest: dict[str, Any], override: str | None, storage: StorageConfig | None
) -> tuple[Tokenizer | None, str, str | None]:
    """(tokenizers' Tokenizer or None, where it was looked for, a note: why there is none, or that it
    is not the one the dataset was packed with)."""
    from raypack.text.files import read_tokenizer

    recorded = manifest.get("tokenizer", {})
    where = override or recorded.get("path") or manifest.get("config", {}).get("tokenizer", {}).get("path")
    if not where:
        return None, "", "the manifest names no tokenizer: ids only (--tokenizer PATH gives one)"
    try:
        loaded = read_tokenizer(TokenizerConfig(path=where, add_eos=False), storage, framed=False)
        tok = loaded.tokenizer
    except ConfigError as e:
        hint = "" if override else " (--tokenizer PATH names where it is now)"
        return None, where, f"cannot read it ({e}): ids only{hint}"
    note = None
    if recorded.get("sha256") and loaded.sha256 != recorded["sha256"]:
        note = (
            "its files differ from those the dataset was packed with (sha256; or one file of the model "
            "directory given): the text may not be what was packed"
        )
    return tok, where, note


def _special_ids(manifest: dict[str, Any], pad_id: int) -> dict[str, int | None]:
    """The ids the manifest records for each of MARKERS, in its order."""
    recorded = manifest.get("tokenizer", {})
    ids = {"pad": pad_id, "bos": recorded.get("bos_id"), "eos": recorded.get("eos_id")}
    return {name: None if ids[name] is None else int(ids[name]) for name in MARKERS}


def _documents(pinned: Pinned, table: pa.Table, storage: StorageConfig | None) -> dict[str, tuple[int, int]]:
    """(chunks, length) of the pack's documents, from index/ (where an id's rows agree): the index
    files of the units whose input file an id names ("path:row", the default ids), else every one
    where there are at most _SCAN_SHARDS. A missing or unreadable index leaves them unknown."""
    wanted = sorted(set(table.column("doc_ids")[0].as_py()))
    units: dict[str, list[int]] = {}
    for unit, entry in enumerate(pinned.manifest.get("inputs", [])):
        for f in entry_files(entry):
            units.setdefault(str(f["path"]), []).append(unit)
    named = [units.get(d.rpartition(":")[0]) for d in wanted]
    read = {u for found in named if found for u in found}
    shards = int(pinned.manifest.get("counts", {}).get("shards", 0))
    if not all(named) and shards <= _SCAN_SHARDS:
        read = set(range(shards))
    seen: dict[str, set[tuple[int, int]]] = {}
    for unit in sorted(read):
        try:
            fs, inner = resolve(index_path(pinned.path, unit), storage)
            found = pq.read_table(
                inner,
                filesystem=fs,
                columns=["doc_id", "chunks", "length"],
                filters=[("doc_id", "in", wanted)],
            )
        except (OSError, pa.ArrowInvalid):
            continue
        for doc_id, chunks, length in zip(
            *(found.column(c).to_pylist() for c in found.column_names), strict=True
        ):
            seen.setdefault(doc_id, set()).add((int(chunks), int(length)))
    return {d: next(iter(v)) for d, v in seen.items() if len(v) == 1}


def _items(
    table: pa.Table,
    tok: Tokenizer | None,
    names: dict[int, str],
    bos: int | None,
    documents: dict[str, tuple[int, int]],
) -> list[Item]:
    row = table.to_pylist()[0]
    ids = np.asarray(row["input_ids"], dtype=np.int64)
    mask = np.asarray(row["loss_mask"], dtype=np.int8) if "loss_mask" in row else None
    starts, lengths, _ = item_spans(table)  # an aligned item (pack.pad_multiple) at its padded start
    items = []
    for k, (doc_id, chunk) in enumerate(zip(row["doc_ids"], row["chunk_index"], strict=True)):
        a, b = int(starts[k]), int(starts[k] + lengths[k])
        item_mask = mask[a:b] if mask is not None else None
        opens = bos if chunk == 0 else None  # a document's first token may be its BOS
        parts, text = _parts(ids[a:b], item_mask, tok, names, opens) if tok else ([], None)
        chunks, length = documents.get(doc_id, (None, None))
        items.append(Item(doc_id, int(chunk), a, b, ids[a:b], item_mask, chunks, length, parts, text))
    return items


def _parts(
    ids: np.ndarray, mask: np.ndarray | None, tok: Tokenizer, names: dict[int, str], bos: int | None
) -> tuple[list[Part], str]:
    """The item's parts (runs of one marker, or of text, each trained or untrained) and its text.
    `bos`: the BOS id where the item starts a document (its first token is ⟨bos⟩ where BOS and EOS
    are one id, as GPT-2's <|endoftext|>)."""
    kind = np.zeros(len(ids), dtype=np.int64)
    labels = ["", *MARKERS]
    for token_id, name in names.items():
        kind[ids == token_id] = labels.index(name)
    if bos is not None and len(ids) and ids[0] == bos:
        kind[0] = labels.index("bos")
    untrained = np.zeros(len(ids), dtype=bool) if mask is None else mask == 0
    if mask is not None and len(ids) and (len(ids) == 1 or mask[1]):
        # Every item's first token is no one's target (the rule, not the data's choice): marked only
        # as part of a longer untrained run, else every item of a plain trl dataset would start with one.
        untrained[0] = False
    cuts = [0, *(np.flatnonzero(np.diff(kind * 2 + untrained)) + 1).tolist(), len(ids)]
    pieces, text = _decode_parts(tok, ids.tolist(), cuts)
    parts = []
    for (a, b), piece in zip(itertools.pairwise(cuts), pieces, strict=True):
        if a == b:
            continue
        name = labels[int(kind[a])]
        shown = f"⟨{name}⟩" * (b - a) if name else piece
        parts.append(Part(a, b, shown, bool(name), bool(untrained[a])))
    return parts, text


def _decode_parts(tok: Tokenizer, ids: list[int], cuts: list[int]) -> tuple[list[str], str]:
    """The text of ids[a:b] for each pair of cuts (0, ..., len(ids)), as a piece of the decode of all
    of `ids`: the difference of two prefixes' decodes, where the shorter is a prefix of the longer (a
    cut inside a character is not: that part is decoded alone); and that decode."""
    spans = list(itertools.pairwise(cuts))
    if len(spans) > _PREFIX_DECODES:
        alone = [tok.decode(ids[a:b], skip_special_tokens=False) for a, b in spans]
        return alone, tok.decode(ids, skip_special_tokens=False)
    pieces, before = [], ""
    for a, b in spans:
        upto = tok.decode(ids[:b], skip_special_tokens=False)
        pieces.append(
            upto[len(before) :]
            if upto.startswith(before)
            else tok.decode(ids[a:b], skip_special_tokens=False)
        )
        before = upto
    return pieces, before


# Rendering: a PackView as text for a reader, or as JSON for a script.

_DIM, _UNDIM, _CYAN, _RESET = "\x1b[2m", "\x1b[22m", "\x1b[36m", "\x1b[39m"
OPEN, CLOSE = "⟦", "⟧"
"""Around untrained text where there is no terminal to dim it."""


def overview(view: PackView, color: bool = False) -> list[str]:
    """The dataset in a few lines: path, format, packs and their lengths, documents, the tokenizer
    and what the markers stand for."""
    m = view.pinned.manifest
    counts = m.get("counts", {})
    lengths: dict[int, int] = {}
    for f in m["files"]:
        lengths[int(f["bucket_length"])] = lengths.get(int(f["bucket_length"]), 0) + int(f["rows"])
    shapes = ", ".join(f"{n:,} of {length:,} tokens" for length, n in sorted(lengths.items()))
    n_files = len(m["files"])
    lines = [
        f"dataset    {view.pinned.path} ({spec_of(m).name})",
        f"packs      {shapes} in {n_files:,} file{'s' if n_files != 1 else ''}; "
        f"{int(counts.get('documents', 0)):,} documents in {int(counts.get('items', 0)):,} items, "
        f"{int(counts.get('tokens', 0)):,} tokens",
    ]
    markers = ", ".join(
        f"⟨{name}⟩ {i}" + (f" {view.token_strings[i]}" if i in view.token_strings else "")
        for i, name in sorted(view.names.items(), key=lambda kv: _SHOWN.index(kv[1]))
    )
    note = f"; {view.tokenizer_note}" if view.tokenizer_note else ""
    lines.append(f"tokenizer  {view.tokenizer or '(none)'}: {markers}{note}")
    if view.masked:
        chat = m.get("chat") or {}
        what = f"chat data ({chat.get('kind')}, loss on {chat.get('loss')})" if chat else "a loss mask"
        lines.append(
            f"loss mask  {what}: untrained tokens {'dimmed' if color else f'between {OPEN} {CLOSE}'}"
        )
    return lines


def render(view: PackView, *, full: bool = False, ids: bool = False, color: bool = False) -> str:
    """The overview and the pack: each item's header line, its text (long ones elided unless
    `full`), its ids with `ids`; untrained text dimmed on a terminal (`color`), else between ⟦ ⟧."""
    lines = overview(view, color)
    trained = (
        f", {sum(int(i.mask.sum()) for i in view.items if i.mask is not None):,} trained"
        if view.masked
        else ""
    )
    lines += [
        "",
        f"pack {view.number:,} (of 0..{view.packs - 1:,}): {view.file} row {view.row:,}; "
        f"{len(view.items)} item{'s' if len(view.items) != 1 else ''}, {view.num_tokens:,} of "
        f"{view.capacity:,} tokens{trained}",
    ]
    for k, (item, end) in enumerate(zip(view.items, padded_ends(view), strict=True)):
        lines.append(_item_header(k, item, end - item.end))
        if item.parts:
            lines.append(_styled(_elided(item.parts, full), color))
        if ids or not item.parts:
            lines.append("ids: " + _ids_text(item.ids, full))
    lines.append(_padding_line(view))
    return "\n".join(lines)


def padded_ends(view: PackView) -> list[int]:
    """Each item's end with its alignment padding (pack.pad_multiple: up to the next multiple of it,
    where the next item starts); an item's own end where the dataset aligns none."""
    k = int(spec_of(view.pinned.manifest).pad_multiple)
    return [-(-item.end // k) * k for item in view.items]


def _item_header(k: int, item: Item, aligned: int = 0) -> str:
    tokens = len(item.ids)
    if item.chunks is None:
        which = f"chunk_index {item.chunk_index}"
    elif item.chunks == 1 and item.length is not None and item.length > tokens:
        which = f"truncated from {item.length:,} tokens"
    elif item.chunks == 1:
        which = "whole document"
    else:
        which = f"chunk_index {item.chunk_index} of {item.chunks} chunks"
    trained = f", {int(item.mask.sum()):,} trained" if item.mask is not None else ""
    where = f"positions {item.start:,}..{item.end:,}"
    if aligned:
        where += f" + {aligned:,} of alignment padding"
    return f"── item {k} · {item.doc_id} · {which} · {tokens:,} tokens{trained} · {where}"


def _padding_line(view: PackView) -> str:
    ends = padded_ends(view)
    end = view.capacity - (ends[-1] if ends else 0)
    aligned = sum(e - item.end for item, e in zip(view.items, ends, strict=True))
    if not end and not aligned:
        return "── no padding"
    name = view.names.get(view.pad_id)
    string = view.token_strings.get(view.pad_id)
    what = " ".join(s for s in (f"⟨{name}⟩" if name else "", string or "") if s)
    line = f"── padding: {end:,} position{'s' if end != 1 else ''} at the end, of id {view.pad_id}" + (
        f" ({what})" if what else ""
    )
    return line + (f"; {aligned:,} of alignment padding after the items" if aligned else "")


def _elided(parts: list[Part], full: bool) -> list[Part]:
    """The parts, their text cut to the first and last ELIDE_CHARS characters (a marker kept whole)
    with the count left out between, where there is more than a third as much again."""
    total = sum(len(p.text) for p in parts)
    if full or total <= 2 * ELIDE_CHARS + ELIDE_CHARS // 3:
        return parts
    head, tail = _kept(parts, ELIDE_CHARS), _kept(parts[::-1], -ELIDE_CHARS)[::-1]
    left = total - sum(len(p.text) for p in (*head, *tail))
    inside = head[-1].untrained and tail[0].untrained
    return [*head, Part(0, 0, f"…[{left:,} characters]…", True, inside), *tail]


def _kept(parts: list[Part], chars: int) -> list[Part]:
    """The first `chars` characters of the parts' text; negative: the last, of parts given last first."""
    kept, room = [], abs(chars)
    for p in parts:
        if room <= 0:
            break
        text = p.text if p.marker else (p.text[:room] if chars > 0 else p.text[-room:])
        kept.append(Part(p.start, p.end, text, p.marker, p.untrained))
        room -= len(text)
    return kept


def _styled(parts: list[Part], color: bool) -> str:
    out, inside = [], False
    for p in parts:
        text = p.text if p.marker else _visible(p.text)
        if color:
            if p.marker:
                text = f"{_CYAN}{text}{_RESET}"
            out.append(f"{_DIM}{text}{_UNDIM}" if p.untrained else text)
            continue
        if p.untrained != inside:
            out.append(OPEN if p.untrained else CLOSE)
            inside = p.untrained
        out.append(text)
    if inside:
        out.append(CLOSE)
    return "".join(out)


def _visible(text: str) -> str:
    """Control characters but newline and tab as escapes: a document's ESC must not drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else f"\\x{ord(c):02x}" for c in text)


def _ids_text(ids: np.ndarray, full: bool) -> str:
    values = ids.tolist()
    if full or len(values) <= 2 * ELIDE_IDS + 4:
        return " ".join(map(str, values))
    left = len(values) - 2 * ELIDE_IDS
    head, tail = values[:ELIDE_IDS], values[-ELIDE_IDS:]
    return f"{' '.join(map(str, head))} …[{left:,} ids]… {' '.join(map(str, tail))}"


def json_record(view: PackView) -> dict[str, Any]:
    """The pack for a script: every item whole (ids, text, positions, untrained spans), nothing elided."""
    m = view.pinned.manifest
    return {
        "dataset": view.pinned.path,
        "format": spec_of(m).name,
        "packs": view.packs,
        "pack": view.number,
        "file": view.file,
        "row": view.row,
        "capacity": view.capacity,
        "num_tokens": view.num_tokens,
        "padding": view.capacity - view.num_tokens,
        "end_padding": view.capacity - (padded_ends(view)[-1] if view.items else 0),
        "pad_id": view.pad_id,
        "loss_mask": view.masked,
        "tokenizer": view.tokenizer or None,
        "tokenizer_note": view.tokenizer_note,
        "markers": {name: i for i, name in sorted(view.names.items())},
        "items": [
            {
                "doc_id": item.doc_id,
                "chunk_index": item.chunk_index,
                "chunks": item.chunks,
                "document_tokens": item.length,
                "start": item.start,
                "end": item.end,
                "padded_end": end,
                "tokens": len(item.ids),
                "ids": item.ids.tolist(),
                "text": item.text,
                "trained": int(item.mask.sum()) if item.mask is not None else None,
                "untrained": item.untrained_spans() if item.mask is not None else None,
            }
            for item, end in zip(view.items, padded_ends(view), strict=True)
        ],
    }
