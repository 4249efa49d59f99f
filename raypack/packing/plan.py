"""A packing plan over a length histogram, and its expansion to per-item (pack, slot, offset).

Histogram packers (bfd, lpfhp, spfhp, nnlshp, bucket) never see individual items. They emit *runs*:
"the items of length L with ranks rank0 .. rank0+count-1 (rank = position among items of that length,
in item order) go q to a pack into packs pack0, pack0+1, ..., at slots slot0.. and offsets offset0..".
A worker holding any subset of items can therefore place them knowing only each item's length and its
global rank among items of that length: no global list of items exists anywhere. The plan's size
grows with the number of distinct (length, pack-pattern) events, not with the number of items: for
10M lognormal(6, 1.2) documents bfd emits 6,199 runs at seq_len 2048 and 24,973 at 8192.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raypack.packing._jit import njit

__all__ = ["RUN_COLUMNS", "Plan", "concat_plans", "expand", "fill_offsets"]

# Columns of the int64 run table. offset0 = -1 means offsets depend on the real lengths of other items
# in the pack (nnlshp packs items of a coarse length class); they are then derived from slot order.
RUN_COLUMNS = ("length", "rank0", "count", "q", "phase", "pack0", "slot0", "offset0")
(R_LEN, R_RANK0, R_COUNT, R_Q, R_PHASE, R_PACK0, R_SLOT0, R_OFF0) = range(len(RUN_COLUMNS))


@dataclass(frozen=True, slots=True)
class Plan:
    """Which ranks of which lengths go where; expand() turns it into per-item placements."""

    seq_len: int
    num_packs: int
    runs: np.ndarray
    """int64[runs, 8], columns RUN_COLUMNS, sorted by (length, rank0); ranks of a length are covered
    contiguously from 0."""
    capacity_start: np.ndarray
    """int64[k]: first pack id of each run of packs sharing a capacity (always starts with 0)."""
    capacity_value: np.ndarray
    """int64[k]: that capacity. One entry (seq_len) except for the bucket algorithm."""

    @classmethod
    def build(
        cls,
        seq_len: int,
        num_packs: int,
        runs: np.ndarray,
        capacity_start: np.ndarray | None = None,
        capacity_value: np.ndarray | None = None,
    ) -> Plan:
        runs = np.asarray(runs, dtype=np.int64).reshape(-1, len(RUN_COLUMNS))
        runs = runs[runs[:, R_COUNT] > 0]
        runs = runs[np.lexsort((runs[:, R_RANK0], runs[:, R_LEN]))]
        if capacity_start is None or capacity_value is None:
            capacity_start = np.zeros(1, dtype=np.int64)
            capacity_value = np.array([seq_len], dtype=np.int64)
        return cls(
            seq_len=seq_len,
            num_packs=int(num_packs),
            runs=np.ascontiguousarray(runs),
            capacity_start=np.asarray(capacity_start, dtype=np.int64),
            capacity_value=np.asarray(capacity_value, dtype=np.int64),
        )

    @property
    def run_ptr(self) -> np.ndarray:
        """int64[seq_len + 2]: runs of length L are rows run_ptr[L]:run_ptr[L + 1]."""
        return np.searchsorted(self.runs[:, R_LEN], np.arange(self.seq_len + 2)).astype(np.int64)

    def coverage(self) -> np.ndarray:
        """int64[seq_len + 1]: items of each length the plan places."""
        return np.bincount(
            self.runs[:, R_LEN], weights=self.runs[:, R_COUNT], minlength=self.seq_len + 1
        ).astype(np.int64)

    def pack_capacity(self) -> np.ndarray:
        """int64[num_packs]: capacity of every pack."""
        ends = np.append(self.capacity_start[1:], self.num_packs)
        return np.repeat(self.capacity_value, ends - self.capacity_start)

    def pack_load(self) -> np.ndarray:
        """int64[num_packs]: tokens in every pack, from the runs alone (no items): O(runs + packs)."""
        return self._per_pack(self.runs[:, R_LEN])

    def pack_depth(self) -> np.ndarray:
        """int64[num_packs]: items (documents or chunks) in every pack, from the runs alone."""
        return self._per_pack(np.ones(len(self.runs), dtype=np.int64))

    def _per_pack(self, weight: np.ndarray) -> np.ndarray:
        """Sum of each pack's items' `weight` (one a run).

        A run puts its items idx = phase .. phase + count - 1 at pack pack0 + idx // q, so its packs
        from first to last get q items each, except the first and last, which get what is left.
        """
        r = self.runs
        count, q, phase, pack0 = (r[:, c] for c in (R_COUNT, R_Q, R_PHASE, R_PACK0))
        first = pack0 + phase // q
        last = pack0 + (phase + count - 1) // q
        load = np.zeros(self.num_packs + 1, dtype=np.int64)
        np.add.at(load, first, weight * q)  # q items in every pack first..last: a difference array
        np.add.at(load, last + 1, -weight * q)
        load = np.cumsum(load)[:-1]
        in_first = np.minimum(q * (phase // q + 1), phase + count) - phase
        np.add.at(load, first, weight * (in_first - q))
        ends = last > first
        in_last = phase + count - q * ((phase + count - 1) // q)
        np.add.at(load, last[ends], (weight * (in_last - q))[ends])
        return load

    @property
    def offsets_known(self) -> bool:
        return bool(np.all(self.runs[:, R_OFF0] >= 0))


def concat_plans(first: Plan, second: Plan, second_rank_base: np.ndarray) -> Plan:
    """Plan `second` after `first`: its pack ids shift past first's, its ranks by second_rank_base[L]."""
    runs = second.runs.copy()
    runs[:, R_PACK0] += first.num_packs
    runs[:, R_RANK0] += second_rank_base[runs[:, R_LEN]]
    return Plan.build(
        first.seq_len,
        first.num_packs + second.num_packs,
        np.concatenate([first.runs, runs]),
        np.concatenate([first.capacity_start, second.capacity_start + first.num_packs]),
        np.concatenate([first.capacity_value, second.capacity_value]),
    )


def expand(
    plan: Plan, item_length: np.ndarray, rank_base: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place items: returns (pack, slot, offset) per item, in item order.

    `rank_base[L]` is the number of items of length L that come before these items in the global item
    order (zero for the whole corpus; per-shard prefix counts in the distributed job). Offsets are -1
    where the plan leaves them to slot order (see fill_offsets).
    """
    if rank_base is None:
        rank_base = np.zeros(plan.seq_len + 1, dtype=np.int64)
    pack_dtype = np.int32 if plan.num_packs < 2**31 else np.int64
    n = len(item_length)
    pack = np.empty(n, dtype=pack_dtype)
    slot = np.empty(n, dtype=np.int32)
    offset = np.empty(n, dtype=np.int32)
    bad = _expand(item_length, rank_base.astype(np.int64), plan.run_ptr, plan.runs, pack, slot, offset)
    if bad >= 0:
        raise ValueError(
            f"item {bad} (length {int(item_length[bad])}) is not covered by the plan: "
            "the plan was made for a different histogram"
        )
    return pack, slot, offset


@njit
def _expand(item_length, rank_base, run_ptr, runs, out_pack, out_slot, out_offset):
    seq_len = len(run_ptr) - 2
    counter = rank_base.copy()
    cursor = np.full(seq_len + 1, -1, dtype=np.int64)
    for i in range(len(item_length)):
        length = item_length[i]
        if length < 1 or length > seq_len:
            return i
        k = counter[length]
        counter[length] = k + 1
        c = cursor[length]
        lo = run_ptr[length]
        hi = run_ptr[length + 1]
        if c < 0 or k < runs[c, R_RANK0]:
            # First item of this length here (or ranks went backwards): binary search the runs.
            a, b = lo, hi
            while a < b:
                mid = (a + b) // 2
                if runs[mid, R_RANK0] <= k:
                    a = mid + 1
                else:
                    b = mid
            c = a - 1
            if c < lo:
                return i
        while c < hi and k >= runs[c, R_RANK0] + runs[c, R_COUNT]:
            c += 1
        if c >= hi:
            return i
        cursor[length] = c
        idx = k - runs[c, R_RANK0] + runs[c, R_PHASE]
        q = runs[c, R_Q]
        t = idx % q
        out_pack[i] = runs[c, R_PACK0] + idx // q
        out_slot[i] = runs[c, R_SLOT0] + t
        off0 = runs[c, R_OFF0]
        out_offset[i] = off0 + t * length if off0 >= 0 else -1
    return -1


def fill_offsets(pack: np.ndarray, slot: np.ndarray, length: np.ndarray, num_packs: int) -> np.ndarray:
    """Offsets from slot order: an item starts where the items in lower slots of its pack end.

    Needs slots 0..k-1 in every pack with k items (all packers guarantee it).
    """
    counts = np.bincount(pack, minlength=num_packs)
    start = np.concatenate(([0], np.cumsum(counts)))
    pos = start[pack] + slot
    flat = np.zeros(len(pack), dtype=np.int64)
    flat[pos] = length
    cum = np.cumsum(flat) - flat
    return (cum[pos] - cum[start[pack]]).astype(np.int32)
