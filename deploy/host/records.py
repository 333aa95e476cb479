"""Frozen records that cost little to define: `@record` in place of `@dataclass(frozen=True)`.

A frozen dataclass writes six methods per class, each compiled from source when the class is
made: the protocol's and the events' hundred-odd classes cost every start of the controller,
and of every host's agent, tens of milliseconds of CPU (with hundreds of hosts on a few cores,
seconds). A record's methods are those of Frozen, written once; dataclasses still collects
its fields, so `fields`, `asdict` and `replace` work as on any dataclass. Instances compare,
hash and print as frozen dataclasses do.
"""
import dataclasses

_INIT_FIELDS = {}
_COMPARED = {}


def record(cls):
    """A frozen record class (see the module's doc); its base classes are records or Frozen."""
    if not issubclass(cls, Frozen):
        raise TypeError("%s: a record derives from Frozen" % cls.__name__)
    return dataclasses.dataclass(init=False, repr=False, eq=False)(cls)


class Frozen:
    """The methods of every record."""

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        cls = type(self)
        fields = _init_fields(cls)
        if len(args) > len(fields):
            raise TypeError("%s() takes %d positional arguments but %d were given" % (
                cls.__qualname__, len(fields), len(args)))
        values = dict(zip((f.name for f in fields), args))
        for name, value in kwargs.items():
            if name in values:
                raise TypeError("%s() got multiple values for argument %r" % (
                    cls.__qualname__, name))
            values[name] = value
        for f in fields:
            if f.name in values:
                value = values.pop(f.name)
            elif f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
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
        raise dataclasses.FrozenInstanceError("cannot assign to field %r" % name)

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError("cannot delete field %r" % name)

    def __repr__(self):
        shown = ", ".join("%s=%r" % (f.name, getattr(self, f.name))
                          for f in dataclasses.fields(self) if f.repr)
        return "%s(%s)" % (type(self).__qualname__, shown)

    def _compared(self):
        cls = type(self)
        if cls not in _COMPARED:
            _COMPARED[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.compare)
        return tuple(getattr(self, name) for name in _COMPARED[cls])

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self):
        return hash(self._compared())


def _init_fields(cls):
    if cls not in _INIT_FIELDS:
        _INIT_FIELDS[cls] = tuple(f for f in dataclasses.fields(cls) if f.init)
    return _INIT_FIELDS[cls]
