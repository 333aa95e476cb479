"""Frozen records that cost little to define and to import: `@record` in place of
`@dataclass(frozen=True)`.

The host package is imported by every host's agent at its start, and by the controller. A
frozen dataclass writes six methods per class, each compiled from source when the class is
made, and the dataclasses module imports inspect (with ast, dis and tokenize): together a
sixth of an agent's CPU before its first answer, on each of many hosts. A record's methods are
those of Frozen, written once, and its fields are collected here from the class's annotations:
`fields`, `asdict` and `replace` below are what the dataclasses functions of those names are
to a dataclass. Instances compare, hash and print as frozen dataclasses do.
"""
import sys


class _Missing:
    def __repr__(self):
        return "MISSING"


# A field without a default (or without a default factory).
MISSING = _Missing()


class FrozenRecordError(AttributeError):
    """An assignment to a record's field, or its deletion."""


class Field:
    """One field of a record: its name, its annotation (`type`, as written: text where the
    module postpones annotations), default (or a factory of its default), and whether
    __init__ takes it, repr shows it and == compares it."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "compare")

    def __init__(self, default=MISSING, default_factory=MISSING, init=True, repr=True,
                 compare=True):
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = self.type = None
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.compare = init, repr, compare

    def required(self):
        return self.default is MISSING and self.default_factory is MISSING

    def __repr__(self):
        return "Field(name=%r, default=%r, default_factory=%r)" % (
            self.name, self.default, self.default_factory)


def field(*, default=MISSING, default_factory=MISSING, init=True, repr=True, compare=True):
    """A field's default, or the factory of a new one each (a list, a dict), and its roles,
    as dataclasses.field takes them."""
    return Field(default, default_factory, init, repr, compare)


def record(cls):
    """A frozen record class (see the module's doc); its base classes are records or Frozen.
    Its fields: those of its bases, then its own annotations in order (a ClassVar is not a
    field); a class attribute of the same name is the default, or a field()."""
    if not issubclass(cls, Frozen):
        raise TypeError("%s: a record derives from Frozen" % cls.__name__)
    collected = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__record_fields__", ()):
            collected[f.name] = f
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _class_variable(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        elif type(value).__module__ == "dataclasses":
            raise TypeError("%s.%s: a record's field is records.field(), not dataclasses'"
                            % (cls.__name__, name))
        else:
            f = Field(default=value)
        if isinstance(f.default, (list, dict, set)):
            raise ValueError("%s.%s: a mutable default is shared by every record: give a "
                             "default_factory" % (cls.__name__, name))
        f.name, f.type = name, annotation
        collected.pop(name, None)
        collected[name] = f
    cls.__record_fields__ = tuple(collected.values())
    defaulted = None
    for f in _init_fields(cls):
        if not f.required():
            defaulted = f.name
        elif defaulted is not None:
            raise TypeError("%s: field %r without a default follows %r with one" % (
                cls.__name__, f.name, defaulted))
    return cls


def _class_variable(annotation):
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def is_record(value):
    """Whether `value` is a record or a record class (or a subclass of one)."""
    return hasattr(value, "__record_fields__")


def fields(value):
    """The fields of a record or record class, in order."""
    if not is_record(value):
        raise TypeError("%r is not a record or a record class" % (value,))
    cls = value if isinstance(value, type) else type(value)
    return cls.__record_fields__


def asdict(value):
    """A record as a dict of its fields, records and dataclasses within it as dicts too, and
    lists, tuples and dicts within it copied."""
    if not is_record(value) or isinstance(value, type):
        raise TypeError("asdict() takes a record, not %r" % (value,))
    return _plain(value)


def _plain(value):
    if is_record(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type):
        # A dataclass here means the dataclasses module is loaded (it made the class).
        return sys.modules["dataclasses"].asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*[_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_plain(k), _plain(v)) for k, v in value.items())
    return value


def replace(value, **changes):
    """A copy of a record with `changes` to its fields."""
    for f in fields(value):
        if not f.init:
            if f.name in changes:
                raise ValueError("field %r cannot be given to replace()" % f.name)
        elif f.name not in changes:
            changes[f.name] = getattr(value, f.name)
    return type(value)(**changes)


class Frozen:
    """The methods of every record."""

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        cls = type(self)
        init = _init_fields(cls)
        if len(args) > len(init):
            raise TypeError("%s() takes %d positional arguments but %d were given" % (
                cls.__qualname__, len(init), len(args)))
        values = dict(zip((f.name for f in init), args))
        for name, value in kwargs.items():
            if name in values:
                raise TypeError("%s() got multiple values for argument %r" % (
                    cls.__qualname__, name))
            values[name] = value
        for f in fields(cls):
            if f.init and f.name in values:
                value = values.pop(f.name)
            elif f.default is not MISSING:
                value = f.default
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            else:
                raise TypeError("%s() missing required argument: %r" % (cls.__qualname__,
                                                                       f.name))
            object.__setattr__(self, f.name, value)
        if values:
            raise TypeError("%s() got an unexpected keyword argument %r" % (
                cls.__qualname__, next(iter(values))))
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __setattr__(self, name, value):
        raise FrozenRecordError("cannot assign to field %r" % name)

    def __delattr__(self, name):
        raise FrozenRecordError("cannot delete field %r" % name)

    def __repr__(self):
        shown = ", ".join("%s=%r" % (f.name, getattr(self, f.name))
                          for f in fields(self) if f.repr)
        return "%s(%s)" % (type(self).__qualname__, shown)

    def _compared(self):
        return tuple(getattr(self, name) for name in _compared_names(type(self)))

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self):
        return hash(self._compared())


_INIT_FIELDS = {}
_COMPARED = {}


def _init_fields(cls):
    if cls not in _INIT_FIELDS:
        _INIT_FIELDS[cls] = tuple(f for f in fields(cls) if f.init)
    return _INIT_FIELDS[cls]


def _compared_names(cls):
    if cls not in _COMPARED:
        _COMPARED[cls] = tuple(f.name for f in fields(cls) if f.compare)
    return _COMPARED[cls]
