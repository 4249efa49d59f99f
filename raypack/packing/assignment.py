"""The result of packing: every item's pack, slot and offset, and a checker for its invariants."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raypack.packing.items import Items

__all__ = ["Assignment", "check_assignment"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """Per item (in item order): pack id, slot (position among the pack's items) and token offset."""

    algorithm: str
    seq_len: int
    items: Items
    pack: np.ndarray
    """int32 (int64 past 2**31 packs)[items]."""
    slot: np.ndarray
    """int32[items]: items of a pack have slots 0..k-1; tokens are laid out in slot order."""
    offset: np.ndarray
    """int32[items]: first token of the item inside its pack."""
    num_packs: int
    pack_capacity: np.ndarray | None = None
    """int64[num_packs] for the bucket algorithm (each pack's bucket length); None: all seq_len."""

    def capacities(self) -> np.ndarray:
        if self.pack_capacity is not None:
            return self.pack_capacity
        return np.full(self.num_packs, self.seq_len, dtype=np.int64)

    def pack_fill(self) -> np.ndarray:
        """int64[num_packs]: real tokens in each pack."""
        return np.bincount(self.pack, weights=self.items.length, minlength=self.num_packs).astype(np.int64)

    def pack_span(self) -> np.ndarray:
        """int64[num_packs]: positions its items take in each pack, their alignment padding included
        (pack_fill where pad_multiple is 1)."""
        if self.items.pad_multiple == 1:
            return self.pack_fill()
        return np.bincount(self.pack, weights=self.items.span, minlength=self.num_packs).astype(np.int64)


def check_assignment(a: Assignment) -> None:
    """Raise ValueError at the first broken invariant; silent when the assignment is sound.

    Checked: every item is in exactly one existing pack; no two items of a pack share a slot and slots
    are 0..k-1; items lie back to back in slot order from offset 0, each taking its span (its length
    rounded up to pad_multiple), so every item starts at a multiple of pad_multiple; no pack exceeds
    its capacity; no pack is empty; each document's items add up to at most its length, in order.
    """
    it = a.items
    n = it.num_items
    for name in ("pack", "slot", "offset"):
        if len(getattr(a, name)) != n:
            raise ValueError(f"{name} has {len(getattr(a, name))} entries for {n} items")
    if n and (a.pack.min() < 0 or a.pack.max() >= a.num_packs):
        raise ValueError("an item is assigned to a pack id outside 0..num_packs-1")
    counts = np.bincount(a.pack, minlength=a.num_packs)
    if a.num_packs and counts.min() == 0:
        raise ValueError(f"pack {int(np.argmin(counts))} is empty")
    order = np.lexsort((a.slot, a.pack))
    p, s = a.pack[order], a.slot[order]
    first = np.cumsum(counts) - counts
    expected_slot = np.arange(n) - np.repeat(first, counts)
    if not np.array_equal(s, expected_slot):
        bad = int(np.flatnonzero(s != expected_slot)[0])
        raise ValueError(f"pack {int(p[bad])}: slots are not 0..k-1 (duplicate or gap)")
    lengths = it.span[order].astype(np.int64)
    cum = np.cumsum(lengths) - lengths
    expected_offset = cum - np.repeat(cum[first], counts)
    if not np.array_equal(a.offset[order], expected_offset):
        bad = int(np.flatnonzero(a.offset[order] != expected_offset)[0])
        raise ValueError(f"pack {int(p[bad])}: item offsets are not back to back in slot order")
    fill = a.pack_span()
    over = np.flatnonzero(fill > a.capacities())
    if over.size:
        raise ValueError(f"pack {int(over[0])} holds {fill[over[0]]} tokens > capacity")
    placed = it.placed_per_doc()
    if np.any(placed > it.doc_length):
        bad = int(np.flatnonzero(placed > it.doc_length)[0])
        raise ValueError(f"document {bad}: items hold more tokens than the document has")
