"""Records (deploy/host/records.py) behave as the frozen dataclasses they replace."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import pytest

from deploy.host.records import Frozen, record


@record
class Base(Frozen):
    name: str
    count: int = 0


@record
class Child(Base):
    extra: Optional[str] = None
    table: Mapping[str, int] = dataclasses.field(default_factory=dict)
    hidden: str = dataclasses.field(default="", repr=False, compare=False)


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


def test_fields_defaults_factories_and_the_dataclass_functions():
    c = Child("y", 1, "e")
    assert (c.name, c.count, c.extra, c.table, c.hidden) == ("y", 1, "e", {}, "")
    assert Child("y").table is not Child("y").table          # a new one each
    assert [f.name for f in dataclasses.fields(c)] == ["name", "count", "extra", "table",
                                                         "hidden"]
    assert dataclasses.asdict(c) == {"name": "y", "count": 1, "extra": "e", "table": {},
                                     "hidden": ""}
    assert dataclasses.replace(c, count=5) == Child("y", 5, "e")
    assert "hidden" not in repr(c)
    assert Child("y", hidden="a") == Child("y", hidden="b")   # compare=False


def test_it_cannot_be_changed():
    a = Base("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "y"
    with pytest.raises(dataclasses.FrozenInstanceError):
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
