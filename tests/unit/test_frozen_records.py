"""Records (deploy/host/records.py) behave as the frozen dataclasses they replace, without the
dataclasses module."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping, Optional

import pytest

from deploy.host.records import (
    Frozen, FrozenRecordError, asdict, field, fields, is_record, record, replace
)


@record
class Base(Frozen):
    name: str
    count: int = 0


@record
class Child(Base):
    extra: Optional[str] = None
    table: Mapping[str, int] = field(default_factory=dict)
    hidden: str = field(default="", repr=False, compare=False)
    kind: ClassVar[str] = "child"           # not a field


@dataclasses.dataclass(frozen=True)
class Same:
    name: str
    count: int = 0


def test_a_record_is_made_compared_and_printed_as_a_frozen_dataclass():
    a, b = Base("x", 2), Base(name="x", count=2)
    assert a == b and hash(a) == hash(b) and a != Base("x", 3)
    assert repr(a) == repr(Same("x", 2)).replace("Same", "Base")
    assert Base("x") == Base("x", 0)
    assert a != Child("x", 2)                 # another class: never equal
    assert {a: 1}[b] == 1


def test_fields_defaults_factories_and_the_functions_named_as_dataclasses_names_them():
    c = Child("y", 1, "e")
    assert (c.name, c.count, c.extra, c.table, c.hidden) == ("y", 1, "e", {}, "")
    assert Child("y").table is not Child("y").table          # a new one each
    assert [f.name for f in fields(c)] == ["name", "count", "extra", "table", "hidden"]
    assert [f.name for f in fields(Child)] == [f.name for f in fields(c)]
    assert asdict(c) == {"name": "y", "count": 1, "extra": "e", "table": {}, "hidden": ""}
    assert replace(c, count=5) == Child("y", 5, "e")
    assert Child.kind == "child" and Child.count == 0 and "table" not in vars(Child)
    assert is_record(c) and is_record(Child) and not is_record(Same("x"))
    assert "hidden" not in repr(c)
    assert Child("y", hidden="a") == Child("y", hidden="b")   # compare=False


def test_it_cannot_be_changed():
    a = Base("x")
    with pytest.raises(FrozenRecordError, match="cannot assign to field 'name'"):
        a.name = "y"
    with pytest.raises(FrozenRecordError, match="cannot delete field 'count'"):
        del a.count


@pytest.mark.parametrize("call, words", [
    (lambda: Base(), "missing required argument: 'name'"),
    (lambda: Base("x", 1, 2), "takes 2 positional arguments but 3 were given"),
    (lambda: Base("x", name="y"), "multiple values for argument 'name'"),
    (lambda: Base("x", colour="red"), "unexpected keyword argument 'colour'"),
])
def test_wrong_arguments_are_refused_as_a_dataclass_refuses_them(call, words):
    with pytest.raises(TypeError, match=words):
        call()


def test_only_a_frozen_class_can_be_a_record():
    with pytest.raises(TypeError, match="derives from Frozen"):
        record(type("Loose", (), {"__annotations__": {"a": int}}))


@record
class Holder(Frozen):
    inner: Base
    items: tuple = ()
    plain: Optional[Same] = None


def test_asdict_goes_into_records_dataclasses_and_containers_within():
    h = Holder(Base("x", 1), (Base("y"), {"k": Base("z")}), Same("s", 2))
    assert asdict(h) == {"inner": {"name": "x", "count": 1},
                         "items": ({"name": "y", "count": 0}, {"k": {"name": "z", "count": 0}}),
                         "plain": {"name": "s", "count": 2}}
    with pytest.raises(TypeError, match="takes a record"):
        asdict(Same("s"))
    with pytest.raises(TypeError, match="not a record"):
        fields(Same)


@pytest.mark.parametrize("body, words", [
    ({"__annotations__": {"a": "list"}, "a": []}, "a mutable default"),
    ({"__annotations__": {"a": "int", "b": "int"}, "a": 1}, "'b' without a default follows 'a'"),
    ({"__annotations__": {"a": "int"}, "a": dataclasses.field(default=1)}, "records.field()"),
])
def test_a_record_class_is_refused_where_a_dataclass_would_be(body, words):
    with pytest.raises((TypeError, ValueError), match=words):
        record(type("Bad", (Frozen,), body))

