"""Documents' metadata as Arrow (raypack.corpus.metadata): each field typed by its values, and the
same values whatever units a corpus is cut into (no Ray, no job)."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.corpus.metadata import conform, kinds_of, metadata_array, unify

# Integers within 2^53 (exact as floats) or past 64 bits (strings from the start): an integer in
# between that meets a float in its unit is rounded, as the module says.
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.integers(2**64, 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
)


def test_each_field_takes_the_kind_its_values_make() -> None:
    rows = [(1, 1, "a", True, None, 1), (2, 0.5, "b", False, None, "x"), (None, 2, None, None, None, 2**70)]
    array = metadata_array(["i", "f", "s", "b", "n", "mixed"], rows)
    assert kinds_of(array) == {
        "i": "int",
        "f": "float",
        "s": "string",
        "b": "bool",
        "n": "null",
        "mixed": "string",
    }
    assert array.to_pylist()[1] == {"i": 2, "f": 0.5, "s": "b", "b": False, "n": None, "mixed": "x"}
    # Another kind beside a string: its JSON text; a whole float as the integer it is.
    assert [r["mixed"] for r in array.to_pylist()] == ["1", "x", str(2**70)]
    assert [r["f"] for r in array.to_pylist()] == [1.0, 0.5, 2.0]
    assert unify("int", "float") == "float" and unify("bool", "int") == "string"
    assert unify("null", "bool") == "bool" and unify("string", "null") == "string"


def test_conform_adds_missing_fields_as_null_in_the_datasets_order() -> None:
    array = metadata_array(["b"], [(1,), (None,)])
    typed = conform(array, 2, {"a": "string", "b": "float"})
    assert typed.type == pa.struct([("a", pa.string()), ("b", pa.float64())])
    assert typed.to_pylist() == [{"a": None, "b": 1.0}, {"a": None, "b": None}]
    assert conform(None, 1, {"a": "int"}).to_pylist() == [{"a": None}]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=30), st.data())
def test_values_do_not_depend_on_how_the_documents_are_cut_into_units(
    rows: list[tuple[Any, Any]], data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(rows) - 1) if len(rows) > 1 else st.nothing())))
    bounds = [0, *cuts, len(rows)]
    units = [metadata_array(["x", "y"], rows[a:b]) for a, b in itertools.pairwise(bounds)]
    kinds = {"x": "null", "y": "null"}
    for unit in units:
        for name, kind in kinds_of(unit).items():
            kinds[name] = unify(kinds[name], kind)
    whole = metadata_array(["x", "y"], rows)
    assert kinds_of(whole) == kinds
    joined = [r for unit in units for r in conform(unit, len(unit), kinds).to_pylist()]
    assert joined == whole.to_pylist()


def test_two_to_the_53_beside_a_float_and_a_bool_reads_the_same_whatever_the_units() -> None:
    """2^53 is a float exactly: a unit that made it one (beside 0.0) gives the text the whole's
    string of it does, "9007199254740992" (hypothesis found "...992.0" against "...992")."""
    rows = [(2**53, None), (0.0, None), (False, None)]
    units = [metadata_array(["x", "y"], rows[:2]), metadata_array(["x", "y"], rows[2:])]
    kinds = {"x": "null", "y": "null"}
    for unit in units:
        for name, kind in kinds_of(unit).items():
            kinds[name] = unify(kinds[name], kind)
    joined = [r["x"] for unit in units for r in conform(unit, len(unit), kinds).to_pylist()]
    assert (
        joined
        == [r["x"] for r in metadata_array(["x", "y"], rows).to_pylist()]
        == [
            "9007199254740992",
            "0",
            "false",
        ]
    )
