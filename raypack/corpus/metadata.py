"""Documents' metadata (input.metadata_fields): the values a record holds in the fields kept, as an
Arrow struct a row a document, each field typed by the values it holds, and unified across the
units of a job. Pure: values in, arrays out.

A field's kind is that of its values, nulls aside: bool, int (64 bits), float, string; null where
none has one. Kinds meet as unify says: int and float make float (an int then as its float), any
other two kinds make string, every value that is not a string then kept as its JSON text ("1",
"true", "0.5"; a whole float as an integer: "1"); an integer past 64 bits is a string from the
start. The same rule over a unit's values (metadata_array) and over the units' arrays (conform)
gives the same values whatever the units, so a document's metadata does not depend on how its
corpus was cut (but for an integer past 2^53 that met a float in its unit: a float, rounded).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["KINDS", "as_text", "conform", "kind_of", "kinds_of", "metadata_array", "not_scalar", "unify"]

KINDS: dict[str, pa.DataType] = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "string": pa.string(),
}
_INT64 = (-(2**63), 2**63)


def not_scalar(value: Any) -> str | None:
    """The type's name of a value that is no metadata (a list, an object, bytes...), else None."""
    if value is None or isinstance(value, (str, int, float)):  # (bool is an int)
        return None
    return type(value).__name__


def kind_of(value: Any) -> str:
    """The kind of one value (not_scalar's None): null, bool, int, float or string."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if _INT64[0] <= value < _INT64[1] else "string"
    return "float" if isinstance(value, float) else "string"


def unify(a: str, b: str) -> str:
    """The kind two kinds make together."""
    if a == b or b == "null":
        return a
    if a == "null":
        return b
    return "float" if {a, b} == {"int", "float"} else "string"


def as_text(value: Any) -> str:
    """A value kept as a string: itself if it is one, else its JSON text, a float that is a whole
    number up to 2^53 as that integer's ("1", not "1.0": an int a unit made a float beside a float
    reads as it would have alone; 2^53 itself is a float exactly)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2.0**53:
        return str(int(value))
    return json.dumps(value)


def _typed(values: Iterable[Any], kind: str) -> pa.Array:
    """Values (of kinds that make `kind`) as an array of it."""
    if kind == "string":
        return pa.array([None if v is None else as_text(v) for v in values], pa.string())
    if kind == "float":
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    return pa.array(list(values), KINDS[kind])


def metadata_array(fields: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.StructArray:
    """The struct of `rows` (a tuple of values a document, in `fields`' order), a child a field of
    the kind its values make."""
    children = []
    for i in range(len(fields)):
        values = [r[i] for r in rows]
        kind = "null"
        for v in values:
            kind = unify(kind, kind_of(v))
        children.append(_typed(values, kind))
    return pa.StructArray.from_arrays(children, names=list(fields))


def _kind_of_type(t: pa.DataType) -> str:
    for kind, arrow in KINDS.items():
        if t == arrow:
            return kind
    raise ValueError(f"{t} is no metadata type (one of {', '.join(map(str, KINDS.values()))})")


def kinds_of(array: pa.StructArray | pa.ChunkedArray) -> dict[str, str]:
    """Each field's kind in a struct of metadata_array's."""
    return {f.name: _kind_of_type(f.type) for f in array.type}


def conform(
    array: pa.StructArray | pa.ChunkedArray | None, rows: int, kinds: Mapping[str, str]
) -> pa.StructArray:
    """`array` (a struct of metadata_array's, or None: no field kept) with `kinds`' fields (at
    least one), in
    their order, each of its kind (the kinds unify gave over every unit's): a field it lacks is
    null; a value of another kind is converted as unify says."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    have = {} if array is None else dict(zip([f.name for f in array.type], array.flatten(), strict=True))
    children = []
    for name, kind in kinds.items():
        child = have.get(name)
        if child is None or child.type == pa.null():
            children.append(pa.nulls(rows, KINDS[kind]))
        elif child.type == KINDS[kind]:
            children.append(child)
        else:
            children.append(_typed(child.to_pylist(), kind))
    return pa.StructArray.from_arrays(children, names=list(kinds))
