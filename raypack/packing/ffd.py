"""First-fit-decreasing: the classic baseline (Johnson 1973), item by item.

Items are taken longest first (ties in item order); each goes into the lowest-numbered pack with room,
found in O(log packs) with a max segment tree over remaining capacities indexed by pack id. It needs the
whole item list in one place, unlike the histogram packers, and its packs come out within a hair of
bfd's; it is here to measure against.
"""

from __future__ import annotations

import numpy as np

from raypack.packing._jit import njit
from raypack.packing.items import Items, check_depth

__all__ = ["assign"]


def assign(
    items: Items, seq_len: int, *, max_depth: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """`max_depth`: a pack holding this many items takes no more (None: no cap)."""
    cap = check_depth(max_depth, items.num_items)
    pack = np.empty(items.num_items, dtype=np.int32 if items.num_items < 2**31 else np.int64)
    slot = np.empty(items.num_items, dtype=np.int32)
    offset = np.empty(items.num_items, dtype=np.int32)
    num_packs = _ffd(items.span, seq_len, cap, pack, slot, offset)
    return pack, slot, offset, int(num_packs)


@njit
def _ffd(length, seq_len, max_depth, out_pack, out_slot, out_offset):
    n = len(length)
    # Counting sort, longest first and stable: O(n + seq_len) instead of an O(n log n) argsort.
    count = np.zeros(seq_len + 2, dtype=np.int64)
    for i in range(n):
        count[seq_len - length[i] + 1] += 1
    for v in range(1, seq_len + 2):
        count[v] += count[v - 1]
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        key = seq_len - length[i]
        order[count[key]] = i
        count[key] += 1
    size = 1
    while size < max(n, 1):
        size *= 2
    room = np.full(2 * size, seq_len, dtype=np.int32)  # every not-yet-opened pack has full room
    depth = np.zeros(max(n, 1), dtype=np.int32)
    num_packs = 0
    for j in range(n):
        i = order[j]
        need = length[i]
        node = 1
        while node < size:
            node = 2 * node if room[2 * node] >= need else 2 * node + 1
        b = node - size
        out_pack[i] = b
        out_slot[i] = depth[b]
        out_offset[i] = seq_len - room[node]
        depth[b] += 1
        if b + 1 > num_packs:
            num_packs = b + 1
        room[node] -= need
        if depth[b] >= max_depth:
            room[node] = 0  # full by count: no item (>= 1 token) fits any more
        node //= 2
        while node >= 1:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return num_packs
