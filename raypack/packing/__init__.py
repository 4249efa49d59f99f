"""Packing algorithms: document lengths in, an assignment of every item to a pack out. No Ray, no I/O.

Two kinds, one table. *Histogram* packers see only the item-length histogram and return a `Plan` that
any worker can expand for its own items from (length, rank among items of that length); the distributed
job uses only these for global packing. *Item* packers need the item list itself (order or identity
matters to them) and are the baselines.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# No numba here: the packers' loops are compiled at their first call (raypack.packing._jit), so a
# process that only names them (a job's driver, checking its config) never imports it.
from raypack.packing import bfd, bucket, concat, decompose, ffd, greedy, lpfhp, nnlshp, spfhp
from raypack.packing._buffers import copy_runs
from raypack.packing._cache import has_entries as compiled_code_cached
from raypack.packing.assignment import Assignment, check_assignment
from raypack.packing.items import OVERFLOW_POLICIES, Items, check_pad_multiple, item_histogram, make_items
from raypack.packing.permute import PackPermutation
from raypack.packing.plan import Plan, expand, fill_offsets

__all__ = [
    "ALGORITHMS",
    "OVERFLOW_POLICIES",
    "Algorithm",
    "Assignment",
    "Items",
    "PackPermutation",
    "Plan",
    "check_assignment",
    "compiled_code_cached",
    "copy_runs",
    "expand",
    "item_histogram",
    "make_items",
    "pack",
]


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One packer: `plan(hist, seq_len, **options) -> Plan` or `assign(items, seq_len)`."""

    name: str
    summary: str
    plan: Callable[..., Plan] | None = None
    assign: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, int]] | None = None
    make_items: Callable[..., Items] = make_items
    aligns: bool = True
    """Can pad every item to a multiple of pad_multiple (concat cuts one stream, decompose makes a pack
    of each chunk)."""
    compared: bool = True
    """Its plan is comparable with the others' on one item histogram (pack.compare): not decompose's,
    whose items are its own chunks and whose packs are never shared."""

    @property
    def is_histogram(self) -> bool:
        return self.plan is not None

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword options the packer accepts (beyond the histogram or items, and seq_len)."""
        fn = self.plan or self.assign
        return _keyword_only(fn) if fn is not None else ()

    def items(
        self, lengths: np.ndarray, seq_len: int, overflow: str, pad_multiple: int = 1, **options: Any
    ) -> Items:
        """The packer's items of documents of `lengths`: its make_items, given those of `options`
        it takes (decompose's min_seq_len; the others' take none), each spanning a multiple of
        `pad_multiple` (ValueError where the packer cannot align, or seq_len is no multiple of it)."""
        if pad_multiple != 1 and not self.aligns:
            raise ValueError(f"{self.name} cannot pad its items to a multiple of pad_multiple={pad_multiple}")
        check_pad_multiple(pad_multiple, seq_len)
        taken = _keyword_only(self.make_items)
        chosen = {k: v for k, v in options.items() if k in taken}
        items = self.make_items(lengths, seq_len, overflow, **chosen)
        return items if pad_multiple == 1 else dataclasses.replace(items, pad_multiple=pad_multiple)


def _keyword_only(fn: Callable[..., Any]) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


ALGORITHMS: dict[str, Algorithm] = {
    "bfd": Algorithm("bfd", "best-fit-decreasing, segment tree (Ding et al. 2024)", plan=bfd.plan),
    "lpfhp": Algorithm("lpfhp", "longest-pack-first histogram packing (Krell et al.)", plan=lpfhp.plan),
    "spfhp": Algorithm("spfhp", "shortest-pack-first histogram packing (Krell et al.)", plan=spfhp.plan),
    "nnlshp": Algorithm("nnlshp", "NNLS histogram packing, depth <= 3 (Krell et al.)", plan=nnlshp.plan),
    "bucket": Algorithm("bucket", "multi-bucket composition (Liu et al. 2024)", plan=bucket.plan),
    "decompose": Algorithm(
        "decompose",
        "dataset decomposition: power-of-two chunks, a sequence each (Pouransari et al. 2024)",
        plan=decompose.plan,
        make_items=decompose.make_items,
        aligns=False,
        compared=False,
    ),
    "ffd": Algorithm("ffd", "first-fit-decreasing (baseline)", assign=ffd.assign),
    "greedy": Algorithm("greedy", "next-fit in input order (baseline)", assign=greedy.assign),
    "concat": Algorithm(
        "concat",
        "concatenate and cut every seq_len (baseline)",
        assign=concat.assign,
        make_items=concat.make_concat_items,
        aligns=False,
    ),
}


def pack(
    lengths: np.ndarray | list[int],
    seq_len: int,
    algorithm: str = "bfd",
    *,
    overflow: str = "split",
    seed: int | None = None,
    pad_multiple: int = 1,
    **options: Any,
) -> Assignment:
    """Pack documents of the given token lengths into packs of `seq_len` tokens.

    With a `seed`, pack ids are a seeded permutation of plan order (PackPermutation), so the packs
    come out shuffled; without one, in the order the packer made them. With a `pad_multiple` k, each
    item takes its span (Items.span, its length rounded up to a multiple of k) and starts at a
    multiple of k; seq_len must be a multiple of k.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    algo = ALGORITHMS[algorithm]
    unknown = sorted(set(options) - set(algo.options))
    if unknown:
        accepted = ", ".join(algo.options) or "none"
        raise ValueError(f"{algorithm} does not take option(s) {', '.join(unknown)} (accepted: {accepted})")
    items = algo.items(np.asarray(lengths), seq_len, overflow, pad_multiple, **options)
    capacity = None
    if algo.plan is not None:
        span = items.span
        plan = algo.plan(item_histogram(span, seq_len), seq_len, **options)
        pack_id, slot, offset = expand(plan, span)
        if not plan.offsets_known:
            offset = fill_offsets(pack_id, slot, span, plan.num_packs)
        num_packs = plan.num_packs
        if np.any(plan.capacity_value != seq_len):
            capacity = plan.pack_capacity()
    elif algo.assign is not None:
        pack_id, slot, offset, num_packs = algo.assign(items, seq_len, **options)
    else:
        raise TypeError(f"algorithm {algorithm!r} defines neither plan nor assign")  # a bug in the table
    if seed is not None and num_packs:
        perm = PackPermutation(num_packs, seed)
        pack_id = perm(pack_id)
        if capacity is not None:
            shuffled = np.empty_like(capacity)
            shuffled[perm(np.arange(num_packs))] = capacity
            capacity = shuffled
    return Assignment(
        algorithm=algorithm,
        seq_len=seq_len,
        items=items,
        pack=pack_id,
        slot=slot,
        offset=offset,
        num_packs=num_packs,
        pack_capacity=capacity,
    )
