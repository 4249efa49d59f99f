from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.packing._segtree import tree_first_ge, tree_last_le, tree_new, tree_set


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 70),
    ops=st.lists(st.tuples(st.integers(0, 69), st.booleans()), max_size=60),
    queries=st.lists(st.integers(-2, 75), max_size=20),
)
def test_queries_match_a_brute_force_set(n: int, ops: list[tuple[int, bool]], queries: list[int]) -> None:
    tree = tree_new(n)
    present: set[int] = set()
    for value, on in ops:
        value %= n
        tree_set(tree, value, on)
        (present.add if on else present.discard)(value)
    for x in queries:
        ge = [v for v in present if v >= x]
        le = [v for v in present if v <= x]
        assert tree_first_ge(tree, x) == (min(ge) if ge else -1)
        assert tree_last_le(tree, x) == (max(le) if le else -1)
