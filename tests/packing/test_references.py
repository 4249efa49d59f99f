"""Each packer against a plain item-by-item transcription of its paper's rule (small inputs).

The histogram packers move whole groups of identical packs at once; these references move one item at
a time. Where ties (equally full packs) make pack identities arbitrary, the multiset of pack fills is
what must agree: it is tie-independent for best and worst fit.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.packing import make_items, pack
from raypack.packing.bucket import default_buckets

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
corpus = st.tuples(
    st.lists(st.integers(1, 90), min_size=0, max_size=70),
    st.integers(1, 40),
)


def items_of(lengths: list[int], seq_len: int) -> list[int]:
    return make_items(np.array(lengths, dtype=np.int64), seq_len).length.tolist()


def fills(a) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(a.pack_fill().tolist())


def reference_bfd(items: list[int], seq_len: int) -> list[int]:
    room: list[int] = []
    for x in sorted(items, reverse=True):
        fits = [r for r in room if r >= x]
        if fits:
            room[room.index(min(fits))] -= x
        else:
            room.append(seq_len - x)
    return sorted(seq_len - r for r in room)


def reference_spfhp(items: list[int], seq_len: int) -> list[int]:
    """Krell et al.: longest length first; each item into the open pack with the most room that fits;
    the items of a length that fit nowhere each open a pack of their own."""
    room: list[int] = []
    for x in sorted(set(items), reverse=True):
        left = items.count(x)
        while left:
            fits = [r for r in room if r >= x]
            if not fits:
                room.extend([seq_len - x] * left)
                break
            room[room.index(max(fits))] -= x
            left -= 1
    return sorted(seq_len - r for r in room)


def reference_lpfhp(items: list[int], seq_len: int, max_depth: int | None) -> Counter[tuple[int, ...]]:
    """Krell et al.'s longest-pack-first histogram packing, transcribed step for step from the
    authors' published procedure (distribute=True): lengths longest first; a length goes into the open
    strategy with the least room that fits it (a linear search upwards from a perfect fit), `repeat`
    copies per pack (as many as fit, lowered until the count left fills one pack); the strategy's
    other packs stay open; a length that fits nowhere opens packs of as many copies as fit. A pack
    that is full or holds max_depth sequences is closed. Returns each pack's sorted lengths, counted."""
    histogram = Counter(items)
    limit = seq_len if max_depth is None else max_depth
    open_: dict[int, list[tuple[int, list[int]]]] = {}  # room -> stack of (packs, lengths)
    closed: list[tuple[int, list[int]]] = []

    def add(lengths: list[int], count: int, room: int) -> None:
        if count:
            (closed if len(lengths) == limit or room == 0 else open_.setdefault(room, [])).append(
                (count, lengths)
            )

    for length in range(seq_len, 0, -1):
        left, offset = histogram.get(length, 0), 0
        while left > 0:
            if length + offset in open_:
                packs, lengths = open_[length + offset].pop()
                repeat = min(1 + offset // length, limit - len(lengths))
                while left // repeat == 0:
                    repeat -= 1
                count = min(packs, left // repeat)
                if packs > count:
                    open_[length + offset].append((packs - count, lengths))
                left -= count * repeat
                add(lengths + [length] * repeat, count, offset - (repeat - 1) * length)
                if not open_[length + offset]:
                    del open_[length + offset]
                offset = 0
            else:
                offset += 1
            if offset >= seq_len - length + 1:  # fits nowhere: new packs
                repeat = min(seq_len // length, limit)
                while left // repeat == 0:
                    repeat -= 1
                add([length] * repeat, left // repeat, seq_len - length * repeat)
                left -= left // repeat * repeat
    out: Counter[tuple[int, ...]] = Counter()
    for count, lengths in closed + [entry for stack in open_.values() for entry in stack]:
        out[tuple(sorted(lengths))] += count
    return out


def reference_ffd(items: list[int], seq_len: int) -> list[int]:
    room: list[int] = []
    for x in sorted(items, reverse=True):
        for i, r in enumerate(room):
            if r >= x:
                room[i] -= x
                break
        else:
            room.append(seq_len - x)
    return sorted(seq_len - r for r in room)


def reference_bucket(
    items: list[int], buckets: tuple[int, ...], threshold: float
) -> list[tuple[int, list[int]]]:
    """Liu et al., one pack at a time: open with the longest item; per bucket (smallest first) fill
    greedily with the longest item that fits; first bucket within the padding threshold, else the
    least padded."""
    pool = sorted(items, reverse=True)
    out = []
    while pool:
        candidates = []
        for b in buckets:
            if b < pool[0]:
                continue
            room, taken = b, []
            rest = list(pool)
            for x in list(rest):
                if x <= room:
                    taken.append(x)
                    room -= x
                    rest.remove(x)
            candidates.append((b, taken, rest, room / b))
            if room / b <= threshold:
                break
        ok = [c for c in candidates if c[3] <= threshold]
        b, taken, rest, _ = ok[0] if ok else min(candidates, key=lambda c: c[3])
        out.append((b, taken))
        pool = rest
    return out


@SETTINGS
@given(corpus)
def test_bfd_matches_item_by_item_best_fit(case: tuple[list[int], int]) -> None:
    lengths, seq_len = case
    assert fills(pack(lengths, seq_len, "bfd")) == reference_bfd(items_of(lengths, seq_len), seq_len)


@SETTINGS
@given(corpus, st.sampled_from([None, 1, 2, 3, 5]))
def test_lpfhp_matches_krell_pack_for_pack(case: tuple[list[int], int], max_depth: int | None) -> None:
    """Not just the fills: the same multiset of packs (each a multiset of item lengths) as Krell et
    al.'s own procedure, with and without a depth cap."""
    lengths, seq_len = case
    options = {} if max_depth is None else {"max_depth": max_depth}
    a = pack(lengths, seq_len, "lpfhp", **options)
    got = Counter(tuple(sorted(a.items.length[a.pack == p].tolist())) for p in range(a.num_packs))
    assert got == reference_lpfhp(items_of(lengths, seq_len), seq_len, max_depth)


@SETTINGS
@given(corpus)
def test_spfhp_matches_krell_worst_fit(case: tuple[list[int], int]) -> None:
    lengths, seq_len = case
    assert fills(pack(lengths, seq_len, "spfhp")) == reference_spfhp(items_of(lengths, seq_len), seq_len)


@SETTINGS
@given(corpus)
def test_ffd_matches_first_fit_decreasing(case: tuple[list[int], int]) -> None:
    lengths, seq_len = case
    assert fills(pack(lengths, seq_len, "ffd")) == reference_ffd(items_of(lengths, seq_len), seq_len)


@SETTINGS
@given(corpus, st.sampled_from([0.0, 0.01, 0.1, 0.5]))
def test_bucket_matches_pack_by_pack_composition(case: tuple[list[int], int], threshold: float) -> None:
    """Pack by pack, in order: the same bucket and the same items, so emitting repeated patterns at
    once changes nothing."""
    lengths, seq_len = case
    a = pack(lengths, seq_len, "bucket", padding_threshold=threshold)
    got = []
    for p in range(a.num_packs):
        got.append((int(a.capacities()[p]), sorted(a.items.length[a.pack == p].tolist(), reverse=True)))
    assert got == reference_bucket(items_of(lengths, seq_len), default_buckets(seq_len), threshold)


@SETTINGS
@given(corpus)
def test_greedy_is_next_fit_in_input_order(case: tuple[list[int], int]) -> None:
    lengths, seq_len = case
    a = pack(lengths, seq_len, "greedy")
    assert np.all(np.diff(a.pack) >= 0)  # order-preserving
    expected, current, fill = [], -1, seq_len
    for x in a.items.length.tolist():
        if fill + x > seq_len:
            current, fill = current + 1, 0
        expected.append(current)
        fill += x
    assert a.pack.tolist() == expected


@SETTINGS
@given(corpus)
def test_concat_cuts_the_stream_every_seq_len(case: tuple[list[int], int]) -> None:
    lengths, seq_len = case
    a = pack(lengths, seq_len, "concat")
    stream = np.cumsum(a.items.length) - a.items.length
    assert np.array_equal(a.pack, stream // seq_len)
    assert np.all(a.pack_fill()[:-1] == seq_len)  # every pack but the last is full
    total = sum(lengths)
    assert a.num_packs == -(-total // seq_len)


def test_ding_worked_example() -> None:
    """Ding et al. (2024), capacity 8: 8, 6, 6, 4 open four packs; 3 then goes into the pack with 4
    tokens of room, the tightest that fits (the two packs holding 6 have only 2)."""
    a = pack([8, 6, 6, 4, 3], 8, "bfd")
    assert a.num_packs == 4
    assert a.pack[4] == a.pack[3]  # 3 joins 4
    assert (a.slot[4], a.offset[4]) == (1, 4)
    assert sorted(a.pack_fill().tolist()) == [6, 6, 7, 8]


def test_split_cuts_only_documents_longer_than_the_context() -> None:
    a = pack([20, 5, 3], 8, "bfd")
    it = a.items
    assert it.length.tolist() == [8, 8, 4, 5, 3]
    assert it.chunk_index().tolist() == [0, 1, 2, 0, 0]
    assert it.start_in_doc().tolist() == [0, 8, 16, 0, 0]
    # 8, 8 fill two packs; 5 + 3 fill a third; 4 (the remainder) a fourth.
    assert a.num_packs == 4
